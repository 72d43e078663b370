"""How fast the trace viewer shows a large run, and how big its ``--html`` file is.

    .venv/bin/python benchmarks/viewer.py [--rollouts 10000] [--max-rollouts 500]

Writes one synthetic run of N rollouts with the real ``TraceWriter`` (not timed): each a user prompt,
a tool call with its result, a reply of about 1 KB and two model calls; a tenth errored. Then:

- served (``prefect-rollouts traces view``, a process of its own, opened as soon as it prints its URL): the
  time from asking a headless Chromium for the run's page to its first table rows, and from a task filter
  (one input event) to the filtered rows; then each ``api/`` answer the page uses, once computed, and one
  rollout opened in full;
- ``--html`` (``--max-rollouts`` of them embedded in full): the time to write it, its size, and the same
  two browser times opened from disk.

Targets (issue 39): first rows and a filter under 1 s each on this machine; the file under 20 MB. Without
Chromium (``apt-get install chromium chromium-driver``) the browser times are left out. Prints the load
average too, since the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import httpx

import prefect_rollouts as vf
from prefect_rollouts.trace import ErrorRecord, ModelCall, ToolCall
from prefect_rollouts.traces import TraceWriter

REPLY = "The answer follows from the numbers given; here is the reasoning step by step. " * 13
RUN = "bench-view"


def write_run(root: str, rollouts: int) -> None:
    rng = random.Random(0)
    writer = TraceWriter(root, RUN, batch_size=5_000)
    for i in range(rollouts):
        reward = float(rng.random() < 0.6)
        trace = vf.Trace(task_id=f"task-{i // 4}", model="m", reward=reward, stop_condition="agent_completed",
                         started_at=1_800_000_000.0 + i * 0.1, rewards={"correct": reward},
                         reward_weights={"correct": 1.0}, timings={"setup": 0.1, "agent": 2.0, "scoring": 0.1})
        trace.messages = [{"role": "user", "content": f"Compute item {i}: what is {i} + 1?"},
                          {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function",
                           "function": {"name": "add", "arguments": f'{{"a": {i}, "b": 1}}'}}]},
                          {"role": "tool", "tool_call_id": f"c{i}", "content": str(i + 1)},
                          {"role": "assistant", "content": REPLY}]
        trace.tool_calls.append(ToolCall(segment=0, id=f"c{i}", name="add", arguments="{}", output=str(i + 1),
                                         latency_ms=1.0))
        for call in range(2):
            trace.model_calls.append(ModelCall(segment=0, started_at=trace.started_at + call, latency_ms=200.0,
                                               prompt_tokens=300, completion_tokens=40, finish_reason="stop"))
            trace.usage.add(300, 40)
        if i % 10 == 9:
            trace.errors.append(ErrorRecord(type="ProviderError", message="upstream returned 503", stage="agent"))
            trace.reward = None
        if writer.add(trace, rollout_index=i % 4, environment="adding", config_hash="h",
                      elapsed_s=rng.uniform(1, 30)):
            writer.flush()
    writer.flush()


def browser():   # type: ignore[no-untyped-def]
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1200"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(driver), options=options)


def page_times(chrome, url: str, rollouts: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(seconds to the first rows of the run's table, seconds from typing a filter to its rows)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    start = time.perf_counter()
    chrome.get(url)
    WebDriverWait(chrome, 120, poll_frequency=0.01).until(
        lambda c: c.find_elements(By.CSS_SELECTOR, "#rollouts tbody tr"))
    first = time.perf_counter() - start
    start = time.perf_counter()   # one input event, as a paste would give (typing gives one per key)
    chrome.execute_script("const box = document.getElementById('f-task'); box.value = 'task-17';"
                          "box.dispatchEvent(new Event('input'));")   # task-17, -170..179, -1700..1799
    WebDriverWait(chrome, 60, poll_frequency=0.01).until(
        lambda c: not c.find_element(By.ID, "rows-count").text.startswith(f"{rollouts} of"))
    return first, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--max-rollouts", type=int, default=500)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-viewer-")
    try:
        started = time.perf_counter()
        write_run(root, args.rollouts)
        print(f"dataset: {args.rollouts} rollouts written in {time.perf_counter() - started:.1f} s (not timed below)")
        chrome = browser()
        env = {**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "src")}
        server = subprocess.Popen([sys.executable, "-m", "prefect_rollouts.cli", "traces", "view", root, "--no-open"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            line = server.stdout.readline() if server.stdout else ""
            found = re.search(r"(http://127\.0\.0\.1:\d+/)\?token=(\S+)", line)
            if not found:
                raise SystemExit(f"the viewer did not start: {line}")
            base, token = found.groups()
            if chrome is not None:   # opened at once: the server has just started (cold)
                first, filtered = page_times(chrome, f"{base}?token={token}#/run/{RUN}", args.rollouts)
                print(f"served page, server just started: first rows {first:.3f} s, filter {filtered:.3f} s")
            for path, params in (("api/rollouts", {"run": RUN}), ("api/runs", {}), ("api/plots", {"run": RUN})):
                start = time.perf_counter()
                answer = httpx.get(base + path, params={"token": token, **params}, timeout=300)
                print(f"served {path} (computed once, then kept): {time.perf_counter() - start:.3f} s, "
                      f"{len(answer.content) / 1e6:.2f} MB")
                if path == "api/rollouts":
                    middle = answer.json()["rows"][args.rollouts // 2][0]   # rollout_id: TABLE_COLUMNS[0]
            start = time.perf_counter()
            httpx.get(base + "api/rollout", params={"token": token, "run": RUN, "id": middle}, timeout=300)
            print(f"served api/rollout (one rollout in full, first time): {time.perf_counter() - start:.3f} s")
        finally:
            server.terminate()
            server.wait(timeout=30)
        page = Path(root) / "view.html"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "prefect_rollouts.cli", "traces", "view", root, "--html", str(page),
                        "--max-rollouts", str(args.max_rollouts)], check=True, env=env, capture_output=True)
        print(f"--html --max-rollouts {args.max_rollouts}: written in {time.perf_counter() - start:.1f} s "
              f"(CLI start included), {page.stat().st_size / 1e6:.2f} MB")
        if chrome is not None:
            first, filtered = page_times(chrome, page.as_uri() + f"#/run/{RUN}", args.rollouts)
            print(f"--html file from disk: first rows {first:.3f} s, filter {filtered:.3f} s")
            chrome.quit()
        print(f"load average: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
