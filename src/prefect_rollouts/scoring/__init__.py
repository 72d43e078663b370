"""Scoring: running task rewards and metrics, placement (shared or isolated), judges.

Contract: functions here record on the ``Trace`` they are given and raise ``TaskError``,
``ScoringEnvError`` or ``InfrastructureError``; the lifecycle records those. Must not import Prefect.
"""
