"""``arithmetic``: deterministic integer addition questions, scored by exact match.

A tiny built-in taskset for smoke tests, demos and benchmarks: it needs no data files and
any chat model can attempt it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

from prefect_rollouts.task import Task, TaskData, reward
from prefect_rollouts.trace import Trace


class Addition(Task):
    """Reward 1.0 when the last integer in the reply equals the answer."""

    @reward
    def correct(self, trace: Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply)
        return float(bool(numbers) and numbers[-1] == self.data.answer)


def load(count: int = 100, seed: int = 0, max_value: int = 100) -> Iterator[Addition]:
    """``count`` questions "What is a + b?" with a, b uniform in [0, max_value], from ``seed``."""
    rng = random.Random(seed)
    for index in range(count):
        a, b = rng.randint(0, max_value), rng.randint(0, max_value)
        yield Addition(TaskData(id=f"add-{seed}-{index}", prompt=f"What is {a} + {b}? Answer with the number only.",
                                answer=str(a + b), info={"a": a, "b": b}))
