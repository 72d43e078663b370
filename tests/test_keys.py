"""One sanitiser for the names an eval keeps on the Prefect server (flows/services/keys.py)."""

from __future__ import annotations

import hashlib

import pytest

from prefect_rollouts.flows.services.keys import comparison_key, prefect_key, progress_key, summary_key, variable_name

pytestmark = pytest.mark.unit


def test_a_name_that_is_a_key_keeps_it():
    """The history of a series such as a deployment's ``nightly-eval`` keeps its artifact key."""
    assert summary_key("nightly-eval") == "eval-summary-nightly-eval"
    assert comparison_key("humaneval") == "eval-comparison-humaneval"
    assert progress_key("bfcl-20261203-113100-ab12") == "eval-progress-bfcl-20261203-113100-ab12"
    assert variable_name("nightly-eval") == "prefect-rollouts-baseline-nightly-eval"


def test_names_that_sanitise_alike_stay_apart():
    hashed = hashlib.sha256(b"Nightly Eval").hexdigest()[:8]
    assert summary_key("Nightly Eval") == f"eval-summary-nightly-eval-{hashed}"
    keys = {summary_key(name) for name in ("Nightly Eval", "nightly-eval", "nightly/eval", "夜间评测", "ночной")}
    assert len(keys) == 5
    assert len({variable_name(name) for name in ("夜间评测", "夜间测试")}) == 2


def test_keys_fit_prefects_limits_and_alphabet():
    for name in ("x" * 300, "Ä" * 300, "a_b.c:d", "", "-"):
        for key in (summary_key(name), comparison_key(name), progress_key(name)):
            assert len(key) <= 100 and all(c.isascii() and (c.islower() or c.isdigit() or c == "-") for c in key), key
        assert len(variable_name(name)) <= 255
    assert prefect_key("p-", "y" * 98, limit=100) == "p-" + "y" * 98
    assert prefect_key("p-", "y" * 99, limit=100).startswith("p-" + "y" * 89 + "-")
