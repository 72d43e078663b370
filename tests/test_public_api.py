"""The top-level API: exactly the documented names, and no Prefect import."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import prefect_rollouts as vf

pytestmark = pytest.mark.unit

SEED_NAMES = {
    "make_agent", "Agent", "Interaction", "AgentConfig", "ClientConfig", "SamplingConfig", "HarnessConfig",
    "RuntimeConfig", "TimeoutConfig", "RetryConfig", "ScoringConfig", "NetworkPolicy", "Task", "TaskData",
    "Trace", "Segment", "Receipt", "reward", "metric", "load_config",
}


def test_all_lists_exactly_the_public_names_sorted():
    public = {n for n, v in vars(vf).items() if not n.startswith("_") and not inspect.ismodule(v)}
    assert sorted(vf.__all__) == sorted(public) == vf.__all__


def test_the_seed_names_are_exported():
    assert SEED_NAMES <= set(vf.__all__)


def test_importing_the_core_does_not_load_prefect():
    code = ("import sys, prefect_rollouts; "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'prefect'], 'prefect was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=8)


def test_config_fields_named_by_the_api_exist():
    assert set(vf.ClientConfig.model_fields) >= {"base_url", "api_key_env", "headers", "timeout"}
    assert set(vf.SamplingConfig.model_fields) >= {"temperature", "top_p", "max_tokens", "seed", "tool_choice", "extra"}
    assert set(vf.TimeoutConfig.model_fields) == {"setup", "agent", "finalize", "scoring"}
    assert set(vf.ScoringConfig.model_fields) >= {"mode", "runtime", "env", "network", "retries",
                                                   "skip_on_truncated", "skip_on_timeout"}
    assert vf.ScoringConfig().retries.max_retries == 2
    assert set(vf.Receipt.model_fields) == {"accepted", "message_id", "mode", "reason"}
    assert {"id", "task_id", "messages", "segments", "model_calls", "tool_calls", "usage", "reward", "rewards",
            "metrics", "info", "errors", "stop_condition", "is_truncated", "is_timeout", "last_reply",
            "timings"} <= set(vf.Trace.model_fields) | set(vf.Trace.model_computed_fields)
