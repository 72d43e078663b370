"""Comparing two runs: paired differences with task-clustered bootstrap intervals, McNemar, flipped
tasks, what could not be paired, tokens and latency; runs written by the real TraceWriter."""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from math import factorial

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import prefect_rollouts as vf
from prefect_rollouts.cli import app
from prefect_rollouts.trace import ErrorRecord, ModelCall
from prefect_rollouts.traces import TraceWriter
from prefect_rollouts.traces.compare import compare, compare_runs
from prefect_rollouts.traces.paired_stats import mcnemar_exact

pytestmark = pytest.mark.unit


def rollout(task_id: str, reward: float | None, *, latencies=(100.0,), info: dict | None = None,
            skipped: str | None = None) -> vf.Trace:
    """A finished rollout: ``reward`` None means it errored; ``skipped`` a skip rule's reason (reward 0)."""
    trace = vf.Trace(task_id=task_id, model="m", reward=0.0 if skipped else reward, stop_condition="agent_completed",
                     info={**(info or {}), **({"scoring_skipped": skipped} if skipped else {})})
    for latency in latencies:
        trace.model_calls.append(ModelCall(segment=0, started_at=1_800_000_000.0, latency_ms=latency,
                                           prompt_tokens=10, completion_tokens=5, finish_reason="stop"))
        trace.usage.add(10, 5)
    if reward is None:
        trace.errors.append(ErrorRecord(type="ProviderError", message="down", stage="segment", status_code=503))
    return trace


def write(root, run_id: str, rollouts: list[tuple[str, vf.Trace] | tuple[str, vf.Trace, int]]) -> None:
    """Write ``(environment, trace[, rollout index])`` rows as one run."""
    writer = TraceWriter(root, run_id)
    for environment, trace, *index in rollouts:
        writer.add(trace, rollout_index=index[0] if index else 0, environment=environment, config_hash="h",
                   elapsed_s=1.0)
    writer.flush()


def binary_run(root, run_id: str, rewards: list[float], env: str = "arith") -> None:
    write(root, run_id, [(env, rollout(f"t{i}", reward)) for i, reward in enumerate(rewards)])


def test_hand_computed_case(tmp_path):
    # six tasks, one rollout each: A passes t0-t4, B passes t4 and t5
    binary_run(tmp_path, "a", [1, 1, 1, 1, 1, 0])
    binary_run(tmp_path, "b", [0, 0, 0, 0, 1, 1])
    env, = compare_runs(tmp_path, "a", "b").environments
    assert (env.environment, env.n_paired, env.n_tasks) == ("arith", 6, 6)
    assert (env.mean_a, env.mean_b, env.difference) == pytest.approx((5 / 6, 2 / 6, -0.5))
    assert env.flipped_to_fail == ["t0", "t1", "t2", "t3"] and env.flipped_to_pass == ["t5"]
    # McNemar: 5 discordant pairs, 4 one way: p = 2 * (C(5,0) + C(5,1)) / 2^5
    assert (env.binary, env.test) == (True, "mcnemar_exact")
    assert env.p_value == pytest.approx(2 * (1 + 5) / 32)
    # differences -1 x4, 0, +1: residuals from -0.5 are -0.5 x4, 0.5, 1.5 (squares sum to 3.5)
    assert env.stderr == pytest.approx(math.sqrt(6 / 5 * 3.5) / 6)
    # the exact bootstrap distribution (enumerated): P(mean <= -1) = 0.088 >= 2.5%; P(mean <= 0) = 0.960
    # and P(mean <= 1/6) = 0.985 around 97.5%, so the 95% percentile interval is [-1, 1/6]
    assert exact_percentile_interval({-1: 4, 0: 1, 1: 1}) == (-1, Fraction(1, 6))
    assert (env.ci_low, env.ci_high) == pytest.approx((-1.0, 1 / 6))


def exact_percentile_interval(values: dict[int, int]) -> tuple[Fraction, Fraction]:
    """The 2.5% and 97.5% points of the exact bootstrap distribution of the mean of ``values``
    (value -> how many tasks have it), by enumerating every multinomial draw."""
    (v1, c1), (v2, c2), (v3, c3) = values.items()
    n = c1 + c2 + c3
    distribution: dict[Fraction, Fraction] = {}
    for k1 in range(n + 1):
        for k2 in range(n + 1 - k1):
            k3 = n - k1 - k2
            p = (Fraction(factorial(n), factorial(k1) * factorial(k2) * factorial(k3))
                 * Fraction(c1, n) ** k1 * Fraction(c2, n) ** k2 * Fraction(c3, n) ** k3)
            mean = Fraction(v1 * k1 + v2 * k2 + v3 * k3, n)
            distribution[mean] = distribution.get(mean, Fraction(0)) + p
    cumulative, points = Fraction(0), []
    for mean in sorted(distribution):
        cumulative += distribution[mean]
        points.append((mean, cumulative))
    return (next(m for m, c in points if c >= Fraction(1, 40)), next(m for m, c in points if c >= Fraction(39, 40)))


def test_two_tasks_give_the_whole_range_as_interval(tmp_path):
    binary_run(tmp_path, "a", [0, 0])
    binary_run(tmp_path, "b", [0, 1])
    env, = compare_runs(tmp_path, "a", "b").environments
    # resampling 2 tasks: both t0 (mean 0) with probability 1/4, both t1 (mean 1) with 1/4
    assert (env.difference, env.ci_low, env.ci_high) == (0.5, 0.0, 1.0)
    assert env.p_value == 1.0 and env.flipped_to_pass == ["t1"]


def test_equal_runs_give_an_interval_covering_zero(tmp_path):
    rewards = [float(i % 3 != 0) for i in range(60)]
    binary_run(tmp_path, "a", rewards)
    binary_run(tmp_path, "b", rewards)
    env, = compare_runs(tmp_path, "a", "b").environments
    assert (env.difference, env.ci_low, env.ci_high, env.p_value) == (0.0, 0.0, 0.0, 1.0)
    assert env.flipped_to_fail == env.flipped_to_pass == []
    # same pass rate, independent outcomes: the runs differ only by chance
    rng = np.random.default_rng(7)
    binary_run(tmp_path, "c", list(rng.binomial(1, 0.7, 200).astype(float)), env="bfcl")
    binary_run(tmp_path, "d", list(rng.binomial(1, 0.7, 200).astype(float)), env="bfcl")
    env, = compare_runs(tmp_path, "c", "d").environments
    assert env.ci_low < 0 < env.ci_high and env.p_value > 0.05 and env.flipped_to_fail and env.flipped_to_pass


def frame(rewards: np.ndarray, rollouts_per_task: int = 1) -> pd.DataFrame:
    """In-memory rows of one run (as read_rollouts returns them), task i's rollouts next to each other."""
    count = len(rewards)
    return pd.DataFrame({"environment": "e", "task_id": [f"t{i // rollouts_per_task}" for i in range(count)],
                         "rollout_index": [i % rollouts_per_task for i in range(count)], "reward": rewards,
                         "is_error": False, "scoring_skipped": None})


@pytest.mark.timeout(60)   # 200 comparisons of 2,000 resamples: 3.3 s alone, past 10 s on a busy machine (CI failed so)
def test_the_interval_covers_zero_95_percent_of_the_time_when_runs_are_equal():
    rng = np.random.default_rng(2024)
    covered = rejected = 0
    for trial in range(200):
        difficulty = rng.uniform(0.1, 0.9, 80)   # tasks differ; both runs are the same model
        a, b = frame(rng.binomial(1, difficulty).astype(float)), frame(rng.binomial(1, difficulty).astype(float))
        env, = compare(a, b, resamples=2000, seed=trial).environments
        covered += env.ci_low <= 0 <= env.ci_high
        rejected += env.p_value < 0.05
    assert 0.90 <= covered / 200 <= 0.99
    assert rejected / 200 <= 0.08


def test_several_rollouts_per_task_are_clustered_by_task():
    rng = np.random.default_rng(3)
    tasks, rollouts = 100, 5
    # a task's rollouts agree (the task is easy or hard for the model): naive errors would be too small
    a = np.repeat(rng.binomial(1, 0.5, tasks), rollouts).astype(float)
    b = np.repeat(rng.binomial(1, 0.5, tasks), rollouts).astype(float)
    env, = compare(frame(a, rollouts), frame(b, rollouts)).environments
    assert (env.n_paired, env.n_tasks, env.test) == (500, 100, "cluster_sign_flip")
    d = b - a
    naive = d.std(ddof=1) / math.sqrt(len(d))
    task_means = d.reshape(tasks, rollouts).mean(axis=1)
    assert env.stderr == pytest.approx(task_means.std(ddof=1) / math.sqrt(tasks))   # equal cluster sizes
    assert env.stderr > 2 * naive
    assert (env.ci_high - env.ci_low) / 2 == pytest.approx(1.96 * env.stderr, rel=0.1)
    changed = task_means != 0
    assert sorted(env.flipped_to_fail + env.flipped_to_pass) == sorted(f"t{i}" for i in np.flatnonzero(changed))


def test_sign_flip_agrees_with_mcnemar_on_one_rollout_per_task():
    from prefect_rollouts.traces.paired_stats import sign_flip_pvalue

    sums = np.array([-1.0] * 9 + [1.0] * 3 + [0.0] * 20)
    exact = mcnemar_exact(9, 3)
    assert exact == pytest.approx(2 * sum(math.comb(12, i) for i in range(4)) / 2 ** 12)
    assert sign_flip_pvalue(sums, resamples=20_000, rng=np.random.default_rng(0)) == pytest.approx(exact, abs=0.01)


def test_unpaired_errored_and_skipped_rollouts_are_counted_never_scored_zero(tmp_path):
    write(tmp_path, "a", [("arith", rollout("t0", 1.0)), ("arith", rollout("t1", 1.0)), ("arith", rollout("t2", 1.0)),
                          ("arith", rollout("t3", 1.0, skipped="truncated"))])
    write(tmp_path, "b", [("arith", rollout("t1", 1.0)), ("arith", rollout("t2", None)), ("arith", rollout("t3", 1.0)),
                          ("arith", rollout("t4", 0.0))])
    env, = compare_runs(tmp_path, "a", "b").environments
    assert (env.n_paired, env.mean_a, env.mean_b, env.difference) == (1, 1.0, 1.0, 0.0)   # t1 only
    assert (env.rollouts_a, env.rollouts_b, env.only_in_a, env.only_in_b) == (4, 4, 1, 1)
    assert (env.errored_a, env.errored_b, env.skipped_a, env.skipped_b) == (0, 1, 1, 0)
    assert env.flipped_to_fail == [] and env.test == "mcnemar_exact" and env.p_value == 1.0


def test_a_run_without_scored_rollouts_has_no_statistics(tmp_path):
    write(tmp_path, "a", [("arith", rollout("t0", 1.0))])
    write(tmp_path, "b", [("arith", rollout("t0", None)), ("other", rollout("u0", 1.0))])
    result = compare_runs(tmp_path, "a", "b")
    arith, other = result.environments
    assert (arith.n_paired, arith.mean_a, arith.difference, arith.ci_low, arith.p_value) == (0, None, None, None, None)
    assert (other.only_in_b, other.rollouts_a, other.tokens_per_rollout_a) == (1, 0, None)


def bfcl(category: str) -> dict:
    return {"task": {"category": category, "functions": [{"name": "category", "parameters": {}}], "ground_truth": []}}


def test_categories_tokens_and_latency_side_by_side(tmp_path):
    write(tmp_path, "a", [("bfcl", rollout("s0", 1.0, latencies=[100, 300], info=bfcl("simple_python"))),
                          ("bfcl", rollout("m0", 1.0, latencies=[200], info=bfcl("multiple"))),
                          ("arith", rollout("t0", 0.5, latencies=[40]))])
    write(tmp_path, "b", [("bfcl", rollout("s0", 0.0, latencies=[50], info=bfcl("simple_python"))),
                          ("bfcl", rollout("m0", 1.0, latencies=[400, 500, 600], info=bfcl("multiple"))),
                          ("arith", rollout("t0", 0.25, latencies=[40]))])
    result = compare_runs(tmp_path, "a", "b")
    arith, tools = result.environments
    assert (arith.binary, arith.test, arith.p_value, arith.difference) == (False, None, None, -0.25)
    assert arith.flipped_to_fail == [] and arith.flipped_to_pass == []   # neither passes at reward >= 1
    assert [(c.environment, c.category, c.n_paired, c.difference) for c in result.categories] == [
        ("bfcl", "multiple", 1, 0.0), ("bfcl", "simple_python", 1, -1.0)]
    assert result.categories[1].flipped_to_fail == ["s0"]
    assert (tools.total_tokens_a, tools.total_tokens_b, tools.tokens_per_rollout_a, tools.tokens_per_rollout_b) == (
        45, 60, 22.5, 30.0)
    assert (tools.model_calls_a, tools.latency_p50_ms_a, tools.latency_p95_ms_a) == (3, 200.0, 290.0)
    assert (tools.model_calls_b, tools.latency_p50_ms_b, tools.latency_p95_ms_b) == (4, 450.0, 585.0)
    multiple = result.categories[0]
    assert (multiple.latency_p50_ms_a, multiple.latency_p50_ms_b) == (200.0, 500.0)
    overall = result.overall
    assert overall is not None and (overall.environment, overall.n_paired, overall.n_tasks) == ("all", 3, 3)
    assert overall.flipped_to_fail == ["bfcl/s0"] and overall.difference == pytest.approx(-1.25 / 3)


def test_the_same_seed_gives_the_same_interval_and_another_seed_may_not():
    rng = np.random.default_rng(5)
    a, b = frame(rng.uniform(0, 1, 300)), frame(rng.uniform(0, 1, 300))
    first, again = compare(a, b, seed=1).environments[0], compare(a, b, seed=1).environments[0]
    other = compare(a, b, seed=2).environments[0]
    assert (first.ci_low, first.ci_high) == (again.ci_low, again.ci_high)
    assert (first.ci_low, first.ci_high) != (other.ci_low, other.ci_high)


def test_bad_input_names_the_field_and_the_fix():
    rows = frame(np.ones(3))
    with pytest.raises(ValueError, match=r"rows_b lacks columns \['reward'\]: read them"):
        compare(rows, rows.drop(columns=["reward"]))
    with pytest.raises(ValueError, match=r"rows_a holds rollout \(e, t0, 0\) twice"):
        compare(pd.concat([rows, rows]), rows)
    with pytest.raises(ValueError, match="rows_a holds 2 runs"):
        compare(pd.concat([rows.assign(run_id="x"), rows.assign(run_id="y", task_id="u")]), rows)
    with pytest.raises(ValueError, match=re.escape("confidence = 1.5")):
        compare(rows, rows, confidence=1.5)


def test_cli_prints_json_and_a_table(tmp_path):
    binary_run(tmp_path, "a", [1, 1, 1, 1, 1, 0])
    binary_run(tmp_path, "b", [0, 0, 0, 0, 1, 1])
    write(tmp_path, "b", [("arith", rollout("t9", None))])
    result = CliRunner().invoke(app, ["traces", "compare", str(tmp_path), "a", "b", "--json"])
    assert result.exit_code == 0, result.output
    env, = json.loads(result.output)["environments"]
    assert {key: env[key] for key in ("environment", "n_paired", "flipped_to_pass", "only_in_a", "only_in_b",
                                       "errored_a", "errored_b")} == {
        "environment": "arith", "n_paired": 6, "flipped_to_pass": ["t5"], "only_in_a": 0, "only_in_b": 1,
        "errored_a": 0, "errored_b": 1}
    assert env["p_value"] == pytest.approx(0.375) and env["difference"] == pytest.approx(-0.5)
    assert env["ci_low"] == pytest.approx(-1.0) and env["ci_high"] == pytest.approx(1 / 6)
    assert env["mean_a"] == pytest.approx(5 / 6) and env["mean_b"] == pytest.approx(2 / 6)
    assert env["flipped_to_fail"] == ["t0", "t1", "t2", "t3"]
    text = CliRunner().invoke(app, ["traces", "compare", str(tmp_path), "a", "b"])
    assert text.exit_code == 0
    assert "arith" in text.output and "[-1.000, +0.167]" in text.output and "McNemar exact" in text.output
    assert "arith: pass -> fail (4) t0, t1, t2, t3; fail -> pass (1) t5" in text.output


def test_cli_names_an_unknown_run_as_a_config_error(tmp_path):
    binary_run(tmp_path, "a", [1])
    result = CliRunner().invoke(app, ["traces", "compare", str(tmp_path), "a", "nightly-2"])
    assert result.exit_code == 2
    assert " ".join(result.output.split()) == (
        f"config error: RUN_B = 'nightly-2': no rollouts of this run in the trace dataset at {tmp_path}. Runs in it: a")


def test_cli_compares_two_runs_on_an_object_store(s3_dataset):
    binary_run(s3_dataset, "a", [1, 1, 0])
    binary_run(s3_dataset, "b", [1, 0, 0])
    result = CliRunner().invoke(app, ["traces", "compare", s3_dataset, "a", "b", "--json"])
    assert result.exit_code == 0, result.output
    env, = json.loads(result.output)["environments"]
    assert (env["n_paired"], env["flipped_to_fail"], env["model_calls_a"]) == (3, ["t1"], 3)
    assert env["difference"] == pytest.approx(-1 / 3)


def test_the_table_writes_both_runs_numbers_of_a_measure_alike(tmp_path):
    write(tmp_path, "a", [("arith", rollout("t0", 1.0, latencies=[24])), ("arith", rollout("t1", 1.0, latencies=[24]))])
    write(tmp_path, "b", [("arith", rollout("t0", 1.0, latencies=[24])),
                          ("arith", rollout("t1", 1.0, latencies=[24, 25]))])
    result = CliRunner().invoke(app, ["traces", "compare", str(tmp_path), "a", "b"])
    assert result.exit_code == 0, result.output
    usage = result.output.split("tokens and model-call latency:\n", 1)[1].splitlines()
    assert usage[0].split() == ["environment", "tokens/rollout", "A", "tokens/rollout", "B", "calls", "A", "calls",
                                "B", "p50", "ms", "A", "p50", "ms", "B", "p95", "ms", "A", "p95", "ms", "B"]
    # tokens per rollout 15 and 22.5, calls 2 and 3, p50 24 and 24, p95 24 and 24.9 (was "15  22.5 ... 24  24.9")
    assert usage[1].split() == ["arith", "15.0", "22.5", "2", "3", "24", "24", "24.0", "24.9"]
