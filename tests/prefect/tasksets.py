"""Tasksets for eval tests, loaded by import path ``tests.prefect.tasksets:numbered``."""

from __future__ import annotations

import asyncio

import prefect_rollouts as vf


class Numbered(vf.Task):
    @vf.reward
    def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)


def numbered(count: int = 10) -> list[Numbered]:
    """Task i asks for the number i; the scripted server decides who answers right."""
    return [Numbered(vf.TaskData(id=f"n{i}", prompt=f"task {i}: say {i}", answer=str(i))) for i in range(count)]


class SlowReward(Numbered):
    @vf.reward
    async def slow(self, trace: vf.Trace) -> float:
        await asyncio.sleep(30)   # past any short scoring deadline
        return 1.0


def slow_reward(count: int = 3) -> list[SlowReward]:
    """Tasks whose reward outlasts a short ``timeouts.scoring``: every rollout ends ``scoring_timeout``."""
    return [SlowReward(vf.TaskData(id=f"s{i}", prompt=f"task {i}: say {i}", answer=str(i))) for i in range(count)]
