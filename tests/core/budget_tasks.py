"""A taskset for budget tests, loaded by import path ``tests.core.budget_tasks:chatty``: each rollout
makes several model calls (one per user turn), so a budget can stop rollouts in flight."""

from __future__ import annotations

import prefect_rollouts as vf


class Chatty(vf.Task):
    @vf.reward
    def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)


def chatty(count: int = 10, turns: int = 3) -> list[Chatty]:
    """Task i asks for the number i, then ``turns - 1`` times more (``user_turns``): ``turns`` model calls."""
    return [Chatty(vf.TaskData(id=f"c{i}", prompt=f"task {i}: say {i}", answer=str(i),
                               user_turns=[f"again: say {i}"] * (turns - 1))) for i in range(count)]
