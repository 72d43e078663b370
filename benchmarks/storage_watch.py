"""What the docker runtime's disk quota watch costs per container, and how far a runaway write gets
past the quota before it is stopped (``runtimes/docker_quota.py``).

Needs the local Docker engine and the sandbox image; every container it starts carries a
``org.prefect-rollouts.run_id`` label of its own and is removed at the end.

    .venv/bin/python benchmarks/storage_watch.py [--containers 8] [--seconds 10] [--files 20000] [--runs 3]

Prints:
- one measurement of a layer (``docker_quota.layer_bytes``), by ``du`` and by the engine's
  ``SizeRw``: wall ms, of an empty layer and of one holding ``--files`` small files;
- ``--containers`` started containers watched for ``--seconds``, with no files and with ``--files``
  small files each: measurements per second and CPU ms per second per container (this process and its ``du`` children; the engine's own CPU under
  ``SizeRw`` is not counted);
- ``--runs`` times ``head -c 3G /dev/zero > /usr/big`` under ``storage_mb = 1024``: the layer when
  it was stopped, MB past the quota, seconds from the start of the write to the end of the
  command, and the kill sweep's wall ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import prefect_rollouts as vf
from prefect_rollouts.errors import AgentFailure
from prefect_rollouts.runtimes import make_runtime
from prefect_rollouts.runtimes.docker import limits as docker_limits
from prefect_rollouts.runtimes.docker import quota as docker_quota
from prefect_rollouts.runtimes.docker.engine import docker_client


def cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed_ms(fn, repeat: int = 10) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def config(storage_mb: int) -> vf.RuntimeConfig:
    return vf.RuntimeConfig(type="docker", storage_mb=storage_mb, exec_timeout_s=120)


async def one_measurement(run_id: str, files: int) -> None:
    api = docker_client().api
    runtime = make_runtime(config(1024), labels={"run_id": run_id})
    await runtime.start()
    try:
        upper = docker_quota.upper_dir(api, runtime.id)
        for label in ("empty", f"{files} files"):
            if label != "empty":
                await runtime.exec(f"mkdir -p /usr/share/many && cd /usr/share/many && "
                                   f"for i in $(seq 1 {files}); do echo x > f$i; done")
            du = timed_ms(lambda: docker_quota.layer_bytes(api, runtime.id, upper)) if upper else float("nan")
            size_rw = timed_ms(lambda: docker_quota.layer_bytes(api, runtime.id, None))
            print(f"one measurement, {label:>12} layer: du {du:6.1f} ms, SizeRw {size_rw:6.1f} ms")
    finally:
        await runtime.stop()


async def watched(run_id: str, containers: int, seconds: float, files: int) -> None:
    runtimes = [make_runtime(config(1024), labels={"run_id": run_id}) for _ in range(containers)]
    await asyncio.gather(*(runtime.start() for runtime in runtimes))
    try:
        if files:
            await asyncio.gather(*(runtime.exec(f"mkdir -p /usr/share/many && cd /usr/share/many && "
                                                f"for i in $(seq 1 {files}); do echo x > f$i; done")
                                   for runtime in runtimes))
        watches = [runtime._quota["watch"] for runtime in runtimes]
        counts = [0] * containers
        for index, watch in enumerate(watches):   # count the watch's measurements
            measure = watch.measure

            def counting(measure=measure, index=index) -> int:  # type: ignore[no-untyped-def]
                counts[index] += 1
                return measure()
            watch.measure = counting
        before, started = cpu_s(), time.perf_counter()
        await asyncio.sleep(seconds)
        elapsed, spent = time.perf_counter() - started, cpu_s() - before
        print(f"{containers} containers of {files or 'no'} files watched {elapsed:.1f} s ({watches[0].how}): "
              f"{sum(counts) / elapsed / containers:.2f} measurements/s and "
              f"{spent / elapsed / containers * 1e3:.2f} ms CPU/s per container")
    finally:
        await asyncio.gather(*(runtime.stop() for runtime in runtimes))


async def runaway(run_id: str, runs: int) -> None:
    api = docker_client().api
    for _ in range(runs):
        runtime = make_runtime(config(1024), labels={"run_id": run_id})
        await runtime.start()
        try:
            started = time.perf_counter()
            try:
                await runtime.exec("head -c 3G /dev/zero > /usr/big")
                outcome = "not stopped"
            except AgentFailure:
                outcome = "stopped"
            took = time.perf_counter() - started
            layer = docker_quota.layer_bytes(api, runtime.id, docker_quota.upper_dir(api, runtime.id))
            sweep = timed_ms(lambda id=runtime.id: docker_limits.kill_all(api, id), repeat=3)
            print(f"3 GB into storage_mb = 1024: {outcome}, layer {layer / 1e6:.0f} MB, "
                  f"{(layer - 2**30) / 1e6:.0f} MB past the quota (bound {docker_quota.OVERSHOOT_MB} MB), "
                  f"{took:.2f} s, kill sweep {sweep:.0f} ms")
        finally:
            await runtime.stop()


async def main(args: argparse.Namespace) -> None:
    run_id = f"bench-{uuid.uuid4().hex[:12]}"
    await one_measurement(run_id, args.files)
    for files in (0, args.files):
        await watched(run_id, args.containers, args.seconds, files)
    await runaway(run_id, args.runs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--containers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    root = docker_client().info().get("DockerRootDir", "")
    if os.path.isdir(root) and shutil.disk_usage(root).free < 6 * 2**30:
        sys.exit(f"less than 6 GiB free on {root} for the runaway write")
    asyncio.run(main(parser.parse_args()))
