"""Tasksets for eval tests, loaded by import path ``tests.prefect.tasksets:numbered``."""

from __future__ import annotations

import asyncio
import threading

import prefect_rollouts as vf


class Numbered(vf.Task):
    @vf.reward
    def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)


def numbered(count: int = 10) -> list[Numbered]:
    """Task i asks for the number i; the scripted server decides who answers right."""
    return [Numbered(vf.TaskData(id=f"n{i}", prompt=f"task {i}: say {i}", answer=str(i))) for i in range(count)]


class Gate:
    """Holds the blocked reward of the ``blocking`` taskset until ``release`` is set (a test sets it when it
    ends); ``returned`` is set when that reward came back: an eval that ended before did not wait for it."""

    def __init__(self) -> None:
        self.release, self.returned = threading.Event(), threading.Event()


BLOCKING_GATE = Gate()
"""The gate of the test that runs (each test puts in its own: a reward released late sets only its own)."""


class Blocking(Numbered):
    @vf.reward
    def correct(self, trace: vf.Trace) -> float:
        if self.data.id == "n0":
            gate = BLOCKING_GATE
            gate.release.wait(120)   # like time.sleep(120): a sync reward that blocks
            gate.returned.set()
        return float(trace.last_reply == self.data.answer)


def blocking(count: int = 10) -> list[Blocking]:
    """Like ``numbered``, but the reward of task ``n0`` blocks its thread for 120 s."""
    return [Blocking(task.data) for task in numbered(count)]


class EnvSeen(vf.Task):
    """Its reward is 1 when the commands of scoring see ``$ROLLOUTS_TEST_EXPECTED`` (from the test's own
    environment) as ``RUNTIME_TOKEN|SCORING_TOKEN|FROM_HOST``: the env tables reached the runtime."""

    @vf.reward
    async def saw_env(self, runtime) -> float:
        import os

        result = await runtime.exec('printf "%s|%s|%s" "$RUNTIME_TOKEN" "$SCORING_TOKEN" "$FROM_HOST"')
        return float(result.stdout == os.environ["ROLLOUTS_TEST_EXPECTED"])


def env_seen(count: int = 2) -> list[EnvSeen]:
    """``count`` tasks ``e<i>`` scored by ``EnvSeen.saw_env``."""
    return [EnvSeen(vf.TaskData(id=f"e{i}", prompt=f"task {i}: say {i}")) for i in range(count)]


class SlowReward(Numbered):
    @vf.reward
    async def slow(self, trace: vf.Trace) -> float:
        await asyncio.sleep(30)   # past any short scoring deadline
        return 1.0


def slow_reward(count: int = 3) -> list[SlowReward]:
    """Tasks whose reward outlasts a short ``timeouts.scoring``: every rollout ends ``scoring_timeout``."""
    return [SlowReward(vf.TaskData(id=f"s{i}", prompt=f"task {i}: say {i}", answer=str(i))) for i in range(count)]
