"""Harnesses: what drives the model through a segment (``chat``: one response; ``tools``: the loop).

Contract: ``Harness`` in ``base.py``; ``make_harness`` maps ``HarnessConfig.id`` to a class.
A harness appends to ``state.trace`` and stops it via ``trace.stop``. Must not import Prefect.
"""

from prefect_rollouts.harnesses.base import Harness, make_harness

__all__ = ["Harness", "make_harness"]
