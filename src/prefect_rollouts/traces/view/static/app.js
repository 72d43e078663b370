// prefect-rollouts trace viewer. Every text from the dataset is hostile: it reaches the page only through
// textContent (text nodes) and never through innerHTML, an attribute of its choosing, or a URL. Links are
// the viewer's own "#/..." routes with each part encoded. The data come from the embedded JSON (a --html
// file) or from the loopback server's api/ (with the launch token).
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("viewer-data").textContent);
  const app = document.getElementById("app");
  const PAGE = 100;
  const cache = new Map();

  async function get(kind, params) {
    const key = kind + "?" + new URLSearchParams(params).toString();
    if (cache.has(key)) return cache.get(key);
    let value;
    if (DATA.mode === "file") {
      value = fromFile(kind, params);
    } else {
      const query = new URLSearchParams(Object.assign({ token: DATA.token }, params));
      const response = await fetch("api/" + kind + "?" + query.toString());
      if (!response.ok) throw new Error(kind + ": " + response.status + " " + (await response.text()));
      value = await response.json();
    }
    cache.set(key, value);
    return value;
  }

  function fromFile(kind, p) {
    if (kind === "runs") return DATA.runs;
    if (kind === "rollouts") return DATA.rollouts[p.run];
    if (kind === "plots") return DATA.plots[p.run] || {};
    if (kind === "rollout") return DATA.details[p.id] || null;
    if (kind === "compare") {
      const found = DATA.comparisons[p.a + "\u0000" + p.b];
      if (!found) throw new Error("this file holds no comparison of " + p.a + " and " + p.b +
        " (write it with more runs embedded, or use the server: prefect-rollouts traces view)");
      return found;
    }
    throw new Error("unknown view " + kind);
  }

  // DOM helpers: children are nodes or strings (text nodes); attributes are the viewer's own.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "onclick" || name === "oninput" || name === "onchange") node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  function route(...parts) { return "#/" + parts.map((p) => encodeURIComponent(String(p))).join("/"); }
  function link(text, ...parts) { return el("a", { href: route(...parts) }, text); }
  function fmt(value, digits) {
    if (value === null || value === undefined) return "—";
    if (typeof value === "number") return Number.isInteger(value) ? value.toLocaleString("en") : value.toFixed(digits === undefined ? 3 : digits);
    if (typeof value === "boolean") return value ? "yes" : "no";
    return String(value);
  }
  function plot(uri, alt) {
    if (typeof uri !== "string" || !uri.startsWith("data:image/svg+xml;base64,")) return null;
    return el("img", { class: "plot", src: uri, alt: alt });
  }
  function table(columns, rows, attrs) {
    return el("table", attrs || {}, el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c)))),
      el("tbody", {}, rows.map((r) => el("tr", {}, r.map((cell) => el("td", {}, cell))))));
  }
  function pre(text, cls) { return el("pre", { class: cls || "" }, text === null || text === undefined ? "" : String(text)); }
  function section(title, ...body) { return el("section", {}, el("h2", {}, title), body); }
  function keyValues(object) {
    return table(["", ""], Object.entries(object || {}).map(([k, v]) =>
      [k, typeof v === "object" && v !== null ? pre(JSON.stringify(v, null, 2)) : fmt(v)]), { class: "kv" });
  }

  // A summary as a grid of small figures; a missing value (null) is left out.
  function figures(object) {
    return el("div", { class: "figures" }, Object.entries(object).filter(([, v]) => v !== null && v !== undefined && v !== "")
      .map(([k, v]) => el("div", { class: "figure" }, el("div", { class: "label" }, k), el("div", { class: "value" }, fmt(v)))));
  }

  async function render() {
    const parts = location.hash.replace(/^#\/?/, "").split("/").filter((p) => p !== "").map(decodeURIComponent);
    app.replaceChildren(el("p", { class: "muted" }, "loading…"));
    try {
      let view;
      if (parts[0] === "run" && parts.length >= 2) view = await runView(parts[1]);
      else if (parts[0] === "rollout" && parts.length >= 3) view = await rolloutView(parts[1], parts[2]);
      else if (parts[0] === "compare" && parts.length >= 3) view = await compareView(parts[1], parts[2]);
      else if (DATA.run && parts.length === 0) { location.hash = route("run", DATA.run); return; }
      else view = await runsView();
      app.replaceChildren(el("nav", {}, el("a", { href: "#/runs" }, "runs")), view);
    } catch (error) {
      app.replaceChildren(el("p", { class: "error" }, String(error && error.message ? error.message : error)));
    }
  }

  async function runsView() {
    const runs = await get("runs", {});
    const rows = runs.map((r) => [link(r.run_id, "run", r.run_id), r.date, r.harness, r.model, r.environment,
      fmt(r.rollouts), fmt(r.mean), r.ci ? "[" + fmt(r.ci[0]) + ", " + fmt(r.ci[1]) + "]" : "—",
      fmt(r.errors), fmt(r.summary.timed_out), fmt(r.summary.total_tokens), fmt(r.summary.cost_usd, 4),
      fmt(r.wall_time_s, 1)]);
    const ids = runs.map((r) => r.run_id);
    const pick = (id, chosen) => el("select", { id: id }, ids.map((run) => el("option", { value: run, selected: run === chosen ? "selected" : null }, run)));
    const selectA = pick("compare-a", ids[Math.max(0, ids.length - 2)]);
    const selectB = pick("compare-b", ids[ids.length - 1]);
    const go = el("button", { id: "compare-go", type: "button", onclick: () => { location.hash = route("compare", selectA.value, selectB.value); } }, "Compare");
    return el("div", {}, el("h1", {}, "Runs"),
      table(["run", "started", "harness", "model", "environment", "rollouts", "mean reward", "95% CI", "errors",
        "timeouts", "tokens", "cost (USD)", "wall time (s)"], rows, { id: "runs" }),
      ids.length > 1 ? section("Compare two runs", el("div", { class: "filters" }, "A ", selectA, " B ", selectB, " ", go)) : null);
  }

  async function runView(run) {
    const data = await get("rollouts", { run: run });   // the table first; the summary and plots as they come
    if (!data) throw new Error("no rollouts of run " + run + " in this file (it holds the run it was written for)");
    const col = Object.fromEntries(data.columns.map((c, i) => [c, i]));
    const values = (name) => [...new Set(data.rows.map((r) => r[col[name]]).filter((v) => v !== null))].sort();
    const state = { sort: null, desc: false, page: 0 };
    const selects = {};
    const choice = (id, label, name) => el("label", {}, label + " ", selects[name] = el("select", { id: id, onchange: update },
      el("option", { value: "" }, "any"), values(name).map((v) => el("option", { value: String(v) }, String(v)))));
    const task = el("input", { id: "f-task", type: "search", placeholder: "task id contains", oninput: update });
    const low = el("input", { id: "f-min", type: "number", step: "any", placeholder: "min", oninput: update });
    const high = el("input", { id: "f-max", type: "number", step: "any", placeholder: "max", oninput: update });
    const filters = el("div", { class: "filters" }, task, el("label", {}, "reward ", low, " – ", high),
      choice("f-stop", "stop", "stop_condition"), choice("f-error", "error", "error_type"),
      choice("f-harness", "harness", "harness"), choice("f-env", "environment", "environment"));
    const shown = ["task_id", "rollout_index", "attempt", "environment", "harness", "reward", "stop_condition",
      "error_type", "total_tokens", "cost_usd", "elapsed_s", "num_model_calls", "num_tool_calls"];
    const count = el("p", { id: "rows-count" });
    const body = el("tbody");
    const pager = el("div", { class: "pager" });
    const head = el("tr", {}, shown.map((name) => el("th", { class: "sortable", onclick: () => {
      state.desc = state.sort === name ? !state.desc : false; state.sort = name; update(); } }, name)));
    function matches(row) {
      const text = task.value.trim().toLowerCase();
      if (text && !String(row[col.task_id]).toLowerCase().includes(text)) return false;
      const reward = row[col.reward];
      if (low.value !== "" && !(reward !== null && reward >= Number(low.value))) return false;
      if (high.value !== "" && !(reward !== null && reward <= Number(high.value))) return false;
      for (const [name, select] of Object.entries(selects)) {
        const wanted = select.value;
        if (wanted !== "" && String(row[col[name]]) !== wanted) return false;
      }
      return true;
    }
    function update(event) {
      if (event && (event.type === "input" || event.type === "change")) state.page = 0;
      let rows = data.rows.filter(matches);
      if (state.sort) {
        const i = col[state.sort], sign = state.desc ? -1 : 1;
        rows = rows.slice().sort((a, b) => sign * compare(a[i], b[i]));
      }
      const pages = Math.max(1, Math.ceil(rows.length / PAGE));
      state.page = Math.min(state.page, pages - 1);
      count.textContent = rows.length + " of " + data.rows.length + " rollouts";
      body.replaceChildren(...rows.slice(state.page * PAGE, (state.page + 1) * PAGE).map((r) =>
        el("tr", { class: r[col.is_error] ? "errored" : "" }, shown.map((name) => el("td", {},
          name === "task_id" ? link(r[col.task_id], "rollout", run, r[col.rollout_id]) : fmt(r[col[name]]))))));
      const turn = (delta) => () => { state.page += delta; update(); };
      pager.replaceChildren(el("button", { type: "button", disabled: state.page === 0 ? "disabled" : null, onclick: turn(-1) }, "previous"),
        " page " + (state.page + 1) + " of " + pages + " ",
        el("button", { type: "button", id: "next-page", disabled: state.page >= pages - 1 ? "disabled" : null, onclick: turn(1) }, "next"));
    }
    update();
    const summary = el("div", { id: "run-summary" }, el("p", { class: "muted" }, "summary loading…"));
    const plots = el("div", { class: "plots" });
    get("runs", {}).then((runs) => summary.replaceChildren(runSummary(runs.find((r) => r.run_id === run))),
      (error) => summary.replaceChildren(el("p", { class: "error" }, String(error.message || error))));
    get("plots", { run: run }).then((p) => plots.replaceChildren(plot(p.rewards, "reward distribution") || "",
      plot(p.tokens, "tokens and wall time") || ""), (error) => plots.replaceChildren(el("p", { class: "error" }, String(error.message || error))));
    return el("div", {}, el("h1", {}, "Run " + run), summary, plots,
      section("Rollouts", filters, count, el("table", { id: "rollouts" }, el("thead", {}, head), body), pager));
  }

  function runSummary(info) {
    if (!info) return el("p", {}, "no summary");
    const s = info.summary || {};
    const passAt = Object.fromEntries(Object.entries(s.pass_at_k || {}).map(([k, v]) => ["pass@" + k, v]));
    return el("div", {},
      figures(Object.assign({ rollouts: s.rollouts, "mean reward": info.mean, "95% CI": info.ci ? fmt(info.ci[0]) + " – " + fmt(info.ci[1]) : null },
        passAt, { errored: s.errored, "timed out": s.timed_out, truncated: s.truncated, skipped: s.skipped,
          "not finished (budget)": s.unfinished || null, retried: s.retried || null, recovered: s.retried ? s.recovered : null,
          tokens: s.total_tokens, "cached tokens": s.cached_tokens, "reasoning tokens": s.reasoning_tokens,
          "judge tokens": s.judge_tokens || null, "cost (USD)": s.cost_usd, "wall time (s)": info.wall_time_s, harness: info.harness, model: info.model })),
      (s.errors || []).length ? section("Most frequent errors", table(["type", "count", "example"], s.errors.map((e) => [e.type, fmt(e.count), e.example || ""]))) : null);
  }

  function compare(a, b) {
    if (a === b) return 0;
    if (a === null || a === undefined) return 1;
    if (b === null || b === undefined) return -1;
    if (typeof a === "number" && typeof b === "number") return a - b;
    return String(a).localeCompare(String(b), "en", { numeric: true });
  }

  async function rolloutView(run, id) {
    const r = await get("rollout", { run: run, id: id });
    if (!r) throw new Error("rollout " + id + " is not in this view (a --html file embeds the first --max-rollouts of each run; serve the dataset to see every one)");
    const k = r.key;
    const attempts = r.attempts.length > 1 ? section("Attempts", table(["attempt", "reward", "stop", "error", ""], r.attempts.map((a) =>
      [a.attempt === k.attempt ? el("strong", {}, String(a.attempt)) : link(String(a.attempt), "rollout", run, a.rollout_id),
        fmt(a.reward), fmt(a.stop_condition), fmt(a.error_type), a.latest ? "latest" : ""]))) : null;
    const u = r.usage;
    return el("div", {}, el("p", {}, link("run " + run, "run", run)),
      el("h1", {}, "Task " + k.task_id + " · rollout " + k.rollout_index + " · attempt " + k.attempt),
      figures({ environment: k.environment, harness: k.harness, model: r.model, reward: r.reward, "stop condition": r.stop_condition,
        truncated: r.is_truncated, "timed out": r.is_timeout, "scoring skipped": r.scoring_skipped, "expected answer": r.expected,
        tokens: u.prompt_tokens + " prompt + " + u.completion_tokens + " completion" + (u.cached_tokens !== null ? " (" + u.cached_tokens + " cached)" : "") +
          (u.reasoning_tokens !== null ? " (" + u.reasoning_tokens + " reasoning)" : ""),
        "cost (USD)": u.cost_usd, "judge tokens": r.judge_usage.total_tokens || null, "wall time (s)": k.elapsed_s }),
      attempts,
      r.errors.length ? section("Errors", table(["type", "stage", "status", "message"], r.errors.map((e) => [e.type, e.stage, fmt(e.status_code), pre(e.message)])), { class: "errors" }) : null,
      section("Conversation", el("div", { id: "conversation" }, r.conversation.map(message))),
      section("Rewards and metrics", table(["name", "value", "weight"], r.rewards.map((x) => ["reward: " + x.name, fmt(x.value), fmt(x.weight)])
        .concat(r.metrics.map((x) => ["metric: " + x.name, fmt(x.value), ""])), { id: "rewards" })),
      r.judges.length ? section("Judges", r.judges.map((j) => el("div", { class: "judge" }, el("h3", {}, j.judge + " (" + j.model + ")"),
        keyValues({ verdict: j.verdict, error: j.error, tokens: j.prompt_tokens + j.completion_tokens, "latency (ms)": j.latency_ms }),
        el("details", {}, el("summary", {}, "prompt and reply"), pre(j.prompt), pre(j.reply))))) : null,
      section("Model calls", table(["#", "segment", "prompt", "completion", "cached", "reasoning", "latency (ms)", "retries", "finish", "status", "error"],
        r.model_calls.map((c) => [fmt(c.index), fmt(c.segment), fmt(c.prompt_tokens), fmt(c.completion_tokens), fmt(c.cached_tokens), fmt(c.reasoning_tokens),
          fmt(c.latency_ms, 1), fmt(c.retries), fmt(c.finish_reason), fmt(c.status_code),
          c.error || (c.attempts.length ? c.attempts.map((a) => a.status_code + ": " + a.error).join("; ") : "")]), { id: "model-calls" }),
        r.rewrites ? el("details", {}, el("summary", {}, "what the endpoint rewrote"), pre(r.rewrites)) : null),
      r.programs.length ? section("Program launches", r.programs.map((p, i) => el("div", { class: "program" }, el("h3", {}, "launch " + (i + 1)), keyValues(p)))) : null,
      r.network.length ? section("Network", table(["phase", "method", "host", "port", "allowed", "reason", "sent", "received", "error"],
        r.network.map((n) => [n.phase, n.method, n.host, fmt(n.port), n.allowed ? "allowed" : "denied", n.reason, fmt(n.bytes_sent), fmt(n.bytes_received), fmt(n.error)]), { id: "network" })) : null,
      r.sends.length ? section("Messages sent during the interaction", table(["id", "mode", "status", "segment", "text"],
        r.sends.map((s) => [s.message_id, s.mode, s.status, fmt(s.delivered_segment), s.text]))) : null,
      section("Timings (s)", keyValues(r.timings)),
      r.info ? section("Info", el("details", {}, el("summary", {}, "trace.info"), pre(r.info))) : null,
      r.agent ? section("Agent", el("details", {}, el("summary", {}, "agent config"), pre(r.agent))) : null);
  }

  function message(m) {
    const badge = m.provenance ? el("span", { class: "badge " + m.provenance }, m.provenance + (m.message_id ? " " + m.message_id : "")) : null;
    const title = m.role === "tool" ? "tool result" + (m.tool_name ? ": " + m.tool_name : "") + (m.tool_call_id ? " (" + m.tool_call_id + ")" : "") : m.role;
    return el("div", { class: "message " + (["system", "user", "assistant", "tool"].includes(m.role) ? m.role : "other") + (m.is_error ? " tool-error" : "") },
      el("div", { class: "role" }, title, badge, m.segment !== null ? el("span", { class: "muted" }, " segment " + m.segment) : null),
      m.parts.map((p) => el("details", { class: "part" }, el("summary", {}, p.type), pre(p.text))),
      m.text ? pre(m.text, "text") : null,
      m.tool_calls.map((c) => el("div", { class: "tool-call" }, el("div", { class: "role" }, "tool call: " + c.name + " (" + c.id + ")",
        c.latency_ms !== null ? el("span", { class: "muted" }, " " + fmt(c.latency_ms, 1) + " ms") : null),
        pre(c.arguments, "arguments"))));
  }

  async function compareView(a, b) {
    const data = await get("compare", { a: a, b: b });
    const c = data.comparison;
    const groups = c.environments.concat(c.overall ? [c.overall] : []);
    return el("div", {}, el("h1", {}, "Compare"), el("p", {}, "A: ", link(a, "run", a), " (" + fmt(c.harness_a) + ", " + fmt(c.model_a) + ")  B: ", link(b, "run", b),
      " (" + fmt(c.harness_b) + ", " + fmt(c.model_b) + "). Differences are B − A; interval: " + c.interval + "."),
      table(["environment", "pairs", "mean A", "mean B", "difference", "95% interval", "p", "to pass", "to fail", "errored A", "errored B", "tokens/rollout A", "tokens/rollout B"],
        groups.map((g) => [g.environment, fmt(g.n_paired), fmt(g.mean_a), fmt(g.mean_b), fmt(g.difference), "[" + fmt(g.ci_low) + ", " + fmt(g.ci_high) + "]",
          fmt(g.p_value), g.flipped_to_pass.join(", ") || "—", g.flipped_to_fail.join(", ") || "—", fmt(g.errored_a), fmt(g.errored_b),
          fmt(g.tokens_per_rollout_a, 1), fmt(g.tokens_per_rollout_b, 1)]), { id: "comparison" }),
      el("div", { class: "plots" }, plot(data.plot, "reward per task")),
      section("Per task", table(["environment", "task", "reward A", "reward B", "difference", "errored A", "errored B"],
        data.tasks.map((t) => [t.environment, t.task_id, fmt(t.reward_a), fmt(t.reward_b), fmt(t.difference), fmt(t.errored_a), fmt(t.errored_b)]), { id: "per-task" })));
  }

  window.addEventListener("hashchange", render);
  render();
})();
