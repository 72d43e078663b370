"""The trace viewer: a run's rollouts in a browser (``prefect-rollouts traces view``), served on loopback
or written as one self-contained HTML file.

Contract: ``data`` turns a dataset into plain JSON-able views (runs with summaries, a run's rollouts, one
rollout, a comparison of two runs); ``plots`` draws them with matplotlib as SVG data URIs; ``page`` is the
one HTML page (our script pinned by its hash in a strict Content-Security-Policy; the data travel as JSON
that is never executed); ``server`` serves it on loopback with a per-launch token. Every text of a rollout
is hostile and reaches the page only as JSON rendered with ``textContent``. Must not import Prefect.
"""

from __future__ import annotations

import shlex


def view_command(root: str, run_id: str) -> str:
    """The shell command that opens run ``run_id`` of the dataset at ``root`` in the viewer (quoted for a
    POSIX shell), e.g. ``prefect-rollouts traces view /data/traces nightly-1``."""
    return f"prefect-rollouts traces view {shlex.quote(str(root))} {shlex.quote(run_id)}"


__all__ = ["view_command"]
