"""What running a Harbor task's tests apart from the agent's processes costs (``runtimes/docker_private.py``).

One box of the sandbox image (as a Harbor task's rollout has); then, ``--runs`` times each, a trivial
``test.sh`` run as a plain ``exec`` (the code before issue 34) and through ``exec_private`` (a helper
container in the box's namespaces, a private root, the tests copied in, the files read back). Prints
the median and p95 wall seconds of each and the difference (the cost per scored rollout).

    .venv/bin/python benchmarks/harbor_private_tests.py [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import prefect_rollouts as vf
from prefect_rollouts.runtimes import make_runtime

TEST = "chmod +x /tests/test.sh && (/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1"


def figures(name: str, seconds: list[float]) -> float:
    median = statistics.median(seconds)
    p95 = sorted(seconds)[max(0, round(0.95 * len(seconds)) - 1)]
    print(f"{name:<14} median {median:.3f} s   p95 {p95:.3f} s   ({len(seconds)} runs)")
    return median


async def main(runs: int) -> None:
    runtime = make_runtime(vf.RuntimeConfig(type="docker", workdir="/app", storage_mb=0))
    await runtime.start()
    try:
        with tempfile.TemporaryDirectory() as tests:
            (Path(tests) / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
            await runtime.exec("mkdir -p /app /logs/verifier /tests")
            await runtime.upload(Path(tests), "/tests")
            plain, private = [], []
            for _ in range(runs):
                started = time.monotonic()
                await runtime.exec(TEST, timeout=60)
                await runtime.exec("cat /logs/verifier/reward.txt", timeout=60)
                plain.append(time.monotonic() - started)
                started = time.monotonic()
                _, files = await runtime.exec_private(  # type: ignore[attr-defined]
                    TEST, inputs={"/tests": Path(tests)}, private=["/tests", "/logs/verifier"],
                    collect="/logs/verifier", keep_bytes=65536, timeout=60)
                private.append(time.monotonic() - started)
                assert files["reward.txt"] == (2, b"1\n"), files
    finally:
        await runtime.stop()
    before = figures("plain exec", plain)
    after = figures("private view", private)
    print(f"the private view costs {after - before:.3f} s more per scored rollout (median)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    asyncio.run(main(parser.parse_args().runs))
