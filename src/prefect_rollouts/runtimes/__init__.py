"""Runtimes: where the agent's tools and the task's commands run.

Contract: ``Runtime`` in ``base.py`` (exec, read_file, write_file, artifacts, start/stop).
``make_runtime`` picks the implementation from ``RuntimeConfig.type``. Must not import Prefect.
"""

from prefect_rollouts.runtimes.base import ExecResult, Runtime, make_runtime

__all__ = ["ExecResult", "Runtime", "make_runtime"]
