"""Latency of one rollout-sized subflow on a Prefect server backed by SQLite and by PostgreSQL.

Backs the README's advice to run Prefect on PostgreSQL (``prefect-rollouts server start``).
Each backend gets a fresh server in its own process; a parent flow runs ``--subflows``
subflows one after another, each with one task run, and the script prints the mean and the
median wall time of a subflow call.

    .venv/bin/python benchmarks/subflow_latency.py [--subflows 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "ERROR")

CHILD = r"""
import asyncio, json, sys, time
from prefect import flow, task

@task
async def stage() -> int:
    return 1

@flow
async def rollout(i: int) -> int:
    return await stage()

@flow
async def parent(n: int) -> list[float]:
    await rollout(-1)                     # warm-up
    walls = []
    for i in range(n):
        started = time.perf_counter()
        await rollout(i)
        walls.append(time.perf_counter() - started)
    return walls

print(json.dumps(asyncio.run(parent(int(sys.argv[1])))))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sqlite_server(home: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    process = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    for _ in range(240):
        try:
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                return api, process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the SQLite-backed server did not start")


def measure(api: str, subflows: int) -> list[float]:
    import json

    out = subprocess.run([sys.executable, "-c", CHILD, str(subflows)], env={**os.environ, "PREFECT_API_URL": api},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subflows", type=int, default=10)
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    from prefect_rollouts.servers import postgres as pgserver

    home = Path(tempfile.mkdtemp(prefix="prefect-rollouts-subflow-"))
    home.chmod(0o755)
    try:
        api, process = sqlite_server(home / "sqlite")
        try:
            sqlite = measure(api, args.subflows)
        finally:
            os.killpg(process.pid, 15)
        api = pgserver.start(home / "pg", port=free_port(), pg_port=free_port())
        try:
            postgres = measure(api, args.subflows)
        finally:
            pgserver.stop(home / "pg")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    for name, walls in (("SQLite", sqlite), ("PostgreSQL", postgres)):
        print(f"{name:10} subflow with one task run, sequential: mean {statistics.mean(walls):.2f} s, "
              f"median {statistics.median(walls):.2f} s ({len(walls)} subflows)")


if __name__ == "__main__":
    main()
