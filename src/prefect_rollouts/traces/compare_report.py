"""``RunComparison`` as plain text for a terminal: what ``prefect-rollouts traces compare`` prints."""

from __future__ import annotations

from typing import Any

from prefect_rollouts.traces.compare import GroupComparison, RunComparison

#: Task ids shown per flip list before "... (N in all)"; ``--json`` lists them all.
SHOWN_TASKS = 10
_TESTS = {"mcnemar_exact": "McNemar exact", "cluster_sign_flip": "sign-flip (tasks)", None: "—"}


def format_comparison(result: RunComparison, *, shown_tasks: int = SHOWN_TASKS) -> str:
    """Tables under a header naming the runs (each with its harness and model) and the interval:
    rewards (means, difference B - A, interval, p-value and test per environment, category and
    overall), the tasks that flipped per environment (the first ``shown_tasks`` of each list), the
    rollouts not compared (only in one run, errored, skipped), and tokens and model-call latency of
    both runs side by side."""
    groups = [*_ordered(result), *([result.overall] if result.overall else [])]
    percent = f"{result.confidence:.0%}"
    lines = [f"run A: {result.run_a} · harness {result.harness_a or '—'} · model {result.model_a or '—'}",
             f"run B: {result.run_b} · harness {result.harness_b or '—'} · model {result.model_b or '—'}",
             "difference = mean B - mean A",
             f"interval: {percent} {result.interval}; {result.resamples} resamples, seed {result.seed}; "
             f"pass: reward >= {result.pass_threshold:g}", ""]
    rewards = [{"environment": g.environment, "category": g.category or "", "pairs": g.n_paired,
                "tasks": g.n_tasks, "mean A": _fixed(g.mean_a), "mean B": _fixed(g.mean_b),
                "B - A": _fixed(g.difference, sign=True),
                f"{percent} interval": "—" if g.ci_low is None else f"[{_fixed(g.ci_low, sign=True)}, "
                                                                     f"{_fixed(g.ci_high, sign=True)}]",
                "p": "—" if g.p_value is None else f"{g.p_value:.4f}", "test": _TESTS[g.test]} for g in groups]
    lines += [_table(rewards, right={"pairs", "tasks", "mean A", "mean B", "B - A", "p"}), ""]
    flips = [f"  {_label(g)}: pass -> fail {_tasks(g.flipped_to_fail, shown_tasks)}; "
             f"fail -> pass {_tasks(g.flipped_to_pass, shown_tasks)}"
             for g in result.environments if g.flipped_to_fail or g.flipped_to_pass]
    lines += ["flipped tasks:", *(flips or ["  none"]), ""]
    counts = ["only_in_a", "only_in_b", "errored_a", "errored_b", "skipped_a", "skipped_b"]
    apart = [{"environment": _label(g), "rollouts A": g.rollouts_a, "rollouts B": g.rollouts_b,
              **{_title(key): getattr(g, key) for key in counts}} for g in groups]
    lines += ["rollouts not compared (counted here, never scored 0):",
              _table(apart, right=_numbers(apart)), ""]
    usage = _alike([{"environment": _label(g), "tokens/rollout A": g.tokens_per_rollout_a,
                     "tokens/rollout B": g.tokens_per_rollout_b, "calls A": g.model_calls_a,
                     "calls B": g.model_calls_b, "p50 ms A": g.latency_p50_ms_a,
                     "p50 ms B": g.latency_p50_ms_b, "p95 ms A": g.latency_p95_ms_a,
                     "p95 ms B": g.latency_p95_ms_b} for g in groups])
    lines += ["tokens and model-call latency:", _table(usage, right=_numbers(usage))]
    return "\n".join(lines)


def _ordered(result: RunComparison) -> list[GroupComparison]:
    """Each environment followed by its categories."""
    ordered = []
    for env in result.environments:
        ordered += [env, *(c for c in result.categories if c.environment == env.environment)]
    return ordered


def _label(group: GroupComparison) -> str:
    return f"{group.environment} / {group.category}" if group.category else group.environment


def _title(key: str) -> str:
    """``only_in_a`` -> ``only in A``."""
    words = key.split("_")
    return " ".join([*words[:-1], words[-1].upper()])


def _numbers(rows: list[dict[str, Any]]) -> set[str]:
    """Every column but the first (the label): right-aligned."""
    return set(list(rows[0])[1:]) if rows else set()


def _tasks(tasks: list[str], shown: int) -> str:
    if not tasks:
        return "none"
    listed = ", ".join(tasks[:shown])
    return f"({len(tasks)}) {listed}" + (", ..." if len(tasks) > shown else "")


def _fixed(value: float | None, *, sign: bool = False) -> str:
    return "—" if value is None else (f"{value:+.3f}" if sign else f"{value:.3f}")


def _alike(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with each measure's numbers (its ``... A`` and ``... B`` columns, every row) written
    alike: whole when every one is whole or at least 100, else all with one decimal (``24.0`` beside
    ``24.3``, never ``24`` beside ``24.3``); None as ``—``."""
    measures: dict[str, list[str]] = {}
    for column in list(rows[0])[1:] if rows else []:
        measures.setdefault(column.removesuffix(" A").removesuffix(" B"), []).append(column)
    for columns in measures.values():
        values = [float(row[c]) for row in rows for c in columns if row[c] is not None]
        digits = 0 if all(v.is_integer() or abs(v) >= 100 for v in values) else 1
        for row in rows:
            for c in columns:
                row[c] = "—" if row[c] is None else f"{float(row[c]):.{digits}f}"
    return rows


def _table(rows: list[dict[str, Any]], *, right: set[str]) -> str:
    """``rows`` as an aligned text table under a header (columns in ``right`` right-aligned)."""
    if not rows:
        return "  (no rollouts)"
    columns = list(rows[0])
    cells = [columns, *([str(row[column]) for column in columns] for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(cell.rjust(width) if column in right else cell.ljust(width)
                               for cell, width, column in zip(line, widths, columns, strict=True)).rstrip()
                     for line in cells)
