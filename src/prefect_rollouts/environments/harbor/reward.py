"""Reading a Harbor task's reward file (``/logs/verifier/reward.json`` or ``reward.txt``) into a reward
and metrics. Must not import Prefect."""

from __future__ import annotations

import json
import math
from typing import Any

from prefect_rollouts.errors import TaskError
from prefect_rollouts.nesting import loads

REWARD_MAX_BYTES = 64 * 1024
"""A reward file larger than this is a scoring error (a reward is a number, or an object of a few)."""

READ_REWARD = f"""for kind in json txt; do
  file=/logs/verifier/reward.$kind
  if [ -f "$file" ] && [ ! -L "$file" ]; then
    echo "$kind $(stat -c %s "$file")"; head -c {REWARD_MAX_BYTES} "$file"; exit 0
  fi
done
echo none"""
"""A shell script printing ``<json|txt> <size>`` and the first ``REWARD_MAX_BYTES`` of the reward file
(a symlink is not read), or ``none``."""


def read_reward(kind: str, text: str, task_id: str) -> tuple[float, dict[str, float]]:
    """``(reward, metrics)`` from the text of ``reward.json`` (``kind = "json"``) or ``reward.txt``.

    ``reward.json``: a number is the reward; an object with a ``reward`` key: that is the reward and
    the other keys are metrics; an object without one: every key is a reward of equal weight, so the
    reward is their mean, and each is also kept as a metric. ``reward.txt``: one number.

    Raises:
        TaskError: the file is empty, not a number (or an object of numbers), holds a non-finite
            one, or (``reward.json``) nests deeper than ``nesting.MAX_JSON_DEPTH`` levels.
    """
    where = f"Harbor task {task_id!r}: /logs/verifier/reward.{kind}"
    if not text.strip():
        raise TaskError(f"{where} is empty; it must hold the reward (a number)")
    if kind == "txt":
        return _finite(text.strip(), where), {}
    try:
        parsed = loads(text, where)
    except ValueError as exc:   # not JSON, nested too deep, or an integer past Python's digit limit
        raise TaskError(f"{exc}; a reward cannot be read from it: {text.strip()[:200]!r}") from None
    if not isinstance(parsed, dict):
        return _finite(parsed, where), {}
    if not parsed:
        raise TaskError(f"{where} is an empty object; give a reward key or at least one number")
    values = {str(key): _finite(value, f"{where} key {key!r}") for key, value in parsed.items()}
    if "reward" in values:
        reward_value = values.pop("reward")
        return reward_value, values
    return _finite(math.fsum(values.values()) / len(values), f"{where}: the mean of its keys"), values


def _finite(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TaskError(f"{where} holds {json.dumps(value)[:200]}, not a number")
    if isinstance(value, int) and abs(value) > 2 ** 1023:
        raise TaskError(f"{where} holds an integer of {len(str(abs(value)))} digits: a reward must be a finite number")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise TaskError(f"{where} holds {str(value)[:200]!r}, not a number") from None
    if not math.isfinite(number):
        raise TaskError(f"{where} holds {value!r}: a reward must be a finite number")
    return number
