"""Tasksets for eval tests, loaded by import path ``tests.prefect.tasksets:numbered``."""

from __future__ import annotations

import prefect_rollouts as vf


class Numbered(vf.Task):
    @vf.reward
    def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)


def numbered(count: int = 10) -> list[Numbered]:
    """Task i asks for the number i; the scripted server decides who answers right."""
    return [Numbered(vf.TaskData(id=f"n{i}", prompt=f"task {i}: say {i}", answer=str(i))) for i in range(count)]
