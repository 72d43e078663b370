"""The viewer's plots, drawn with matplotlib (Agg, no display) as SVG and returned as ``data:`` URIs for an
``<img>``: an image-rendered SVG runs no script, loads nothing, and needs no CDN or font.

Labels come from the dataset (task ids, run ids): matplotlib writes them as glyph paths
(``svg.fonttype = "path"``), so no text of a rollout reaches the SVG's markup.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import Any

MAX_TASK_BARS = 60
"""Tasks drawn in a comparison's reward-per-task plot (those with the largest differences first)."""


def _figure(width: float = 5.0, height: float = 2.6) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=72)
    return figure, figure.add_subplot()


def _uri(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="svg", metadata={"Date": None})   # the same data give the same bytes
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode()


def _rc() -> Any:
    import matplotlib

    return matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "prefect-rollouts", "font.size": 9})


def reward_histogram(rewards: Sequence[float], run_id: str) -> str:
    """The distribution of a run's rewards (scored rollouts only) as a histogram; a data URI of an SVG."""
    with _rc():
        figure, axes = _figure()
        if rewards:
            low, high = min(rewards), max(rewards)
            bins = 10 if high > low else 1
            axes.hist(list(rewards), bins=bins, range=(low, high) if high > low else (low - 0.5, low + 0.5),
                      color="#4c72b0", edgecolor="white")
        axes.set_xlabel("reward")
        axes.set_ylabel("rollouts")
        axes.set_title(f"reward distribution ({len(rewards)} scored)")
        return _uri(figure)


def tokens_and_time(tokens: Sequence[float], elapsed_s: Sequence[float]) -> str:
    """Tokens against wall seconds, one point per rollout; a data URI of an SVG."""
    with _rc():
        figure, axes = _figure()
        axes.scatter(list(elapsed_s), list(tokens), s=6, alpha=0.5, color="#dd8452", rasterized=len(tokens) > 2000)
        axes.set_xlabel("wall time per rollout (s)")
        axes.set_ylabel("tokens")
        axes.set_title("tokens and wall time per rollout")
        return _uri(figure)


def reward_per_task(tasks: Sequence[str], rewards_a: Sequence[float | None], rewards_b: Sequence[float | None],
                    run_a: str, run_b: str) -> str:
    """Mean reward per task in runs A and B, side by side (the ``MAX_TASK_BARS`` tasks whose difference is
    largest when there are more); a data URI of an SVG. A task a run did not score has no bar."""
    def value(x: float | None) -> float:
        return math.nan if x is None else float(x)

    rows = list(zip(tasks, map(value, rewards_a), map(value, rewards_b), strict=True))
    if len(rows) > MAX_TASK_BARS:
        rows = sorted(rows, key=lambda r: -abs(0 if math.isnan(r[2] - r[1]) else r[2] - r[1]))[:MAX_TASK_BARS]
    with _rc():
        figure, axes = _figure(width=max(5.0, 0.25 * len(rows) + 2), height=3.0)
        positions = range(len(rows))
        axes.bar([p - 0.2 for p in positions], [r[1] for r in rows], width=0.4, label="A", color="#4c72b0")
        axes.bar([p + 0.2 for p in positions], [r[2] for r in rows], width=0.4, label="B", color="#dd8452")
        axes.set_xticks(list(positions), [r[0][:24] for r in rows], rotation=60, ha="right", fontsize=7)
        axes.set_ylabel("mean reward")
        axes.set_title("reward per task: A and B")
        axes.legend(loc="upper right", fontsize=7)
        return _uri(figure)
