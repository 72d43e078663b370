"""notebooks/traces.ipynb runs headless (nbclient) on a dataset written by the real TraceWriter."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

import prefect_rollouts as vf
from prefect_rollouts.trace import ErrorRecord, ModelCall
from prefect_rollouts.traces import TraceWriter
from prefect_rollouts.traces.schema import ROLLOUTS

# Unit tier, with a minute per test instead of its 10 s: a test here executes the notebook in a Jupyter
# kernel (a module fixture, set up in the test that first needs it), 2-3 s on a quiet machine and 7-10 s
# beside two other unit workers and the serial tests (a CI run timed out three of them at 10.04 s).
pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOK = NOTEBOOKS / "traces.ipynb"
T0 = 1_800_000_000.0
#: Whether the dataset has judge token columns (the notebook plots them only when it does).
JUDGE_TOKENS = {"judge_prompt_tokens", "judge_completion_tokens"} <= set(ROLLOUTS.names)


class _ThisPython(KernelSpecManager):
    """Every kernel name resolves to ipykernel on this interpreter (the project's venv), whatever
    kernelspecs the machine has installed: nothing has to be registered by hand."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                          display_name="Python 3", language="python", name=kernel_name)


#: Run after the notebook's imports: every figure shown is measured before it is drawn inline
#: (legend texts, axes titles, bars, and how many bars a legend box overlaps).
RECORD_FIGURES = """
import json as _json
FIGURES = []
_show = plt.show


def _recording_show(*args, **kwargs):
    fig = plt.gcf()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    boxes = [legend.get_window_extent(renderer) for legend in legends]
    bars = [patch.get_window_extent(renderer) for ax in fig.axes for patch in ax.patches]
    bars = [bar for bar in bars if bar.width > 0 and bar.height > 0]   # not the empty slot of a missing series
    FIGURES.append({"titles": [ax.get_title() for ax in fig.axes], "bars": len(bars),
                    "legends": [[text.get_text() for text in legend.get_texts()] for legend in legends],
                    "covered": int(sum(bool(bar.overlaps(box)) for bar in bars for box in boxes))})
    _show(*args, **kwargs)


plt.show = _recording_show
"""


def run_notebook(traces: Path, tmp: Path, run_id: str | None = None, **variables: str) -> nbformat.NotebookNode:
    """Execute the notebook (cwd = notebooks/) against ``traces``, recording its figures
    (``figures``); ``variables`` are more ``PREFECT_ROLLOUTS_*`` settings (``RUN_A="..."``).
    Returns it with outputs."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    setup = [cell.id for cell in nb.cells].index("setup")
    record = nbformat.v4.new_code_cell(RECORD_FIGURES)
    report = nbformat.v4.new_code_cell('print("FIGURES", _json.dumps(FIGURES))')
    record.id, report.id = "record-figures", "report-figures"
    nb.cells[setup + 1:setup + 1] = [record]
    nb.cells.append(report)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_ROLLOUTS_RUN_ID", "PREFECT_ROLLOUTS_RUN_A",
                                                               "PREFECT_ROLLOUTS_RUN_B")}
    env.update({f"PREFECT_ROLLOUTS_{name}": value for name, value in variables.items()})
    env.update(PREFECT_ROLLOUTS_TRACES=str(traces), IPYTHONDIR=str(tmp / "ipython"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"))
    if run_id is not None:
        env["PREFECT_ROLLOUTS_RUN_ID"] = run_id
    km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=_ThisPython())
    client = NotebookClient(nb, km=km, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute(env=env)
    return nb


def call(latency_ms: float, *, prompt: int = 10, completion: int = 5, finish: str | None = "stop",
         **fields) -> ModelCall:
    return ModelCall(segment=0, started_at=T0, latency_ms=latency_ms, prompt_tokens=prompt,
                     completion_tokens=completion, finish_reason=finish, **fields)


def trace(task_id: str, reward: float | None, calls: list[ModelCall], *, info: dict | None = None,
          stop: str = "agent_completed") -> vf.Trace:
    t = vf.Trace(task_id=task_id, model="m", reward=reward, stop_condition=stop, info=info or {},
                 model_calls=calls, started_at=T0)
    for c in calls:
        t.usage.add(c.prompt_tokens, c.completion_tokens)
    if reward is not None:
        t.rewards = {"correct": reward}
    return t


def bfcl(category: str) -> dict:
    return {"task": {"category": category, "functions": [], "ground_truth": []}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """Two runs, two environments; bfcl tasks in two categories, arithmetic tasks without one.

    truncated: simple_python_1 (max_turns) and multiple_1 (finish 'length', scoring skipped);
    timeout: add-1; skipped: multiple_1; error: add-2; ok: simple_python_0, multiple_0, add-0.
    """
    root = tmp_path_factory.mktemp("traces")
    timed_out = trace("add-1", 0.0, [call(1000)], info={"task": {"a": 1, "b": 2}})
    timed_out.record_timeout("agent")
    errored = trace("add-2", None, [call(1500, prompt=0, completion=0, finish=None, retries=2, status_code=503,
                                         error="ProviderError: 503 endpoint down")],
                    info={"task": {"a": 2, "b": 2}}, stop="provider_error")
    errored.errors.append(ErrorRecord(type="ProviderError", message="endpoint down after 3 attempts",
                                      stage="segment", status_code=503))
    runs = {
        ("run-a", "bfcl"): [
            trace("simple_python_0", 1.0, [call(100), call(300, prompt=20, completion=8)], info=bfcl("simple_python")),
            trace("simple_python_1", 0.25, [call(200)], info=bfcl("simple_python"), stop="max_turns"),
            trace("multiple_0", 1.0, [call(400, prompt=30)], info=bfcl("multiple")),
            trace("multiple_1", 0.0, [call(600, completion=50, finish="length")],
                  info={**bfcl("multiple"), "scoring_skipped": "truncated"}),
        ],
        ("run-b", "arith"): [
            trace("add-0", 1.0, [call(50)], info={"task": {"a": 0, "b": 1}}),
            timed_out,
            errored,
        ],
    }
    if JUDGE_TOKENS:   # multiple_0 was judged
        runs[("run-a", "bfcl")][2].judge_usage.add(100, 7)
    runs[("run-a", "bfcl")][0].usage.cost_usd = 0.25   # a priced client (schema version 7: cost_usd)
    for (run_id, environment), traces in runs.items():
        writer = TraceWriter(root, run_id)
        for t in traces:
            writer.add(t, rollout_index=0, environment=environment, config_hash="h", elapsed_s=1.0)
        assert writer.flush() == len(traces)
    return root


@pytest.fixture(scope="module")
def two_models(tmp_path_factory) -> Path:
    """One run of two models on the same two tasks: model-x solves both, model-y one."""
    root = tmp_path_factory.mktemp("two-models")
    writer = TraceWriter(root, "run-c")
    for model, rewards in (("model-x", [1.0, 1.0]), ("model-y", [1.0, 0.0])):
        for index, reward in enumerate(rewards):
            t = trace(f"add-{index}", reward, [call(100 * (index + 1))])
            t.model = model
            writer.add(t, rollout_index=0 if model == "model-x" else 1, environment="arith", config_hash="h",
                       elapsed_s=1.0)
    writer.flush()
    return root


@pytest.fixture(scope="module")
def nightlies(tmp_path_factory) -> Path:
    """Two nightly runs of the same tasks (night-2 started a day after night-1).

    bfcl simple_python s0-s3: night-1 passes all, night-2 only s3; bfcl multiple m0-m1: both pass
    m0, night-2 also m1; arith a0-a2: equal rewards, a2 errored in night-2 (counted, not paired).
    """
    root = tmp_path_factory.mktemp("nightlies")
    rewards = {"night-1": {"s0": 1, "s1": 1, "s2": 1, "s3": 1, "m0": 1, "m1": 0, "a0": 1, "a1": 0, "a2": 1},
               "night-2": {"s0": 0, "s1": 0, "s2": 0, "s3": 1, "m0": 1, "m1": 1, "a0": 1, "a1": 0, "a2": None}}
    for night, (run_id, by_task) in enumerate(rewards.items()):
        writer = TraceWriter(root, run_id)
        for task_id, reward in by_task.items():
            category = {"s": "simple_python", "m": "multiple"}.get(task_id[0])
            t = trace(task_id, None if reward is None else float(reward), [call(100.0 * (night + 1))],
                      info=bfcl(category) if category else {"task": {}},
                      stop="provider_error" if reward is None else "agent_completed")
            if reward is None:
                t.errors.append(ErrorRecord(type="ProviderError", message="down", stage="segment", status_code=503))
            t.started_at = T0 + 86_400 * night
            writer.add(t, rollout_index=0, environment="bfcl" if category else "arith", config_hash="h",
                       elapsed_s=1.0)
        writer.flush()
    return root


@pytest.fixture(scope="module")
def executed_nightlies(nightlies, tmp_path_factory) -> dict[str, nbformat.NotebookNode]:
    return execute(nightlies, tmp_path_factory.mktemp("kernel"))


def execute(traces: Path, tmp: Path, run_id: str | None = None, **variables: str) -> dict[str, nbformat.NotebookNode]:
    return {cell.id: cell for cell in run_notebook(traces, tmp, run_id, **variables).cells}


@pytest.fixture(scope="module")
def executed(dataset, tmp_path_factory) -> dict[str, nbformat.NotebookNode]:
    """The notebook on both runs of ``dataset``."""
    return execute(dataset, tmp_path_factory.mktemp("kernel"))


@pytest.fixture(scope="module")
def executed_one_run(dataset, tmp_path_factory) -> dict[str, nbformat.NotebookNode]:
    """The notebook on run-a only: one run of one model, one environment."""
    return execute(dataset, tmp_path_factory.mktemp("kernel"), run_id="run-a")


@pytest.fixture(scope="module")
def executed_two_models(two_models, tmp_path_factory) -> dict[str, nbformat.NotebookNode]:
    return execute(two_models, tmp_path_factory.mktemp("kernel"))


def figures(cells) -> dict[str, dict]:
    """What ``RECORD_FIGURES`` measured, keyed by the title of each figure's first axes."""
    line = next(line for line in text(cells["report-figures"]).splitlines() if line.startswith("FIGURES "))
    return {figure["titles"][0]: figure for figure in json.loads(line.removeprefix("FIGURES "))}


def text(cell) -> str:
    """What a cell printed to stdout or displayed as plain text (figures and kernel stderr left out)."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream" and output.name == "stdout":
            parts.append(output.text)
        elif "data" in output and "image/png" not in output.data:
            parts.append(output.data.get("text/plain", ""))
    return "\n".join(parts)


def header(cell) -> list[str]:
    """The column names of the first table a cell shows."""
    return text(cell).split("\n", 1)[0].split()


def row(cell, *labels: str) -> list[float]:
    """The numbers on the line of a printed table whose labels (index values) are ``labels``.

    A leading RangeIndex number is ignored; pass only the labels the line shows (pandas leaves
    a repeated outer MultiIndex value blank).
    """
    for line in text(cell).splitlines():
        fields = line.split()
        if fields[:1] and fields[0].isdigit():
            fields = fields[1:]
        if fields[:len(labels)] == list(labels):
            return [float(value) for value in fields[len(labels):]]
    raise AssertionError(f"no row {labels} in:\n{text(cell)}")


def test_committed_notebook_is_clean_nbformat4_on_python3():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.nbformat == 4 and nb.metadata.kernelspec.name == "python3"
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(not cell.outputs and cell.execution_count is None for cell in code)
    assert code[0].metadata.get("tags") == ["parameters"]


def test_runs_end_to_end_and_draws_every_plot(executed):
    errors = [o for cell in executed.values() for o in cell.get("outputs", []) if o.output_type == "error"]
    assert not errors
    plots = [cell_id for cell_id, cell in executed.items()
             if any("image/png" in o.get("data", {}) for o in cell.get("outputs", []))]
    assert plots == ["reward-by-category", "tokens", "latency", "outcomes"]
    assert "7 rollouts, 8 model calls" in text(executed["load"])


def test_spend_counts_judge_tokens_and_the_cost_per_run_task_and_rollout(executed):
    cell = executed["spend"]
    # run-a: 15 + 28 + 15 + 40 + 55 agent tokens and 107 of the judge; cost only where a price was given
    assert re.search(r"run-a\s+4\s+260\s+107\s+0\.25\b", text(cell)), text(cell)
    assert re.search(r"run-b\s+3\s+30\s+0\s+NaN", text(cell)), text(cell)
    assert re.search(r"run-a\s+bfcl\s+simple_python_0\s+1\s+43\s+0\s+0\.25", text(cell)), text(cell)
    assert re.search(r"run-a\s+bfcl\s+multiple_0\s+0\s+1\s+142\s+107\s+NaN", text(cell)), text(cell)


def test_outcome_breakdown_counts_each_flag(executed):
    cell = executed["outcomes"]
    assert header(cell) == ["arith", "bfcl", "all"]
    assert row(cell, "truncated") == [0, 2, 2]
    assert row(cell, "timeout") == [1, 0, 1]
    assert row(cell, "skipped") == [0, 1, 1]
    assert row(cell, "error") == [1, 0, 1]
    assert row(cell, "ok") == [1, 2, 3]
    assert "scoring skipped because: truncated (1)" in text(cell)
    errors = text(executed["errors"])
    assert re.search(r"arith\s+ProviderError\s+provider_error\s+1\s+endpoint down after 3 attempts", errors)
    assert re.search(r"arith\s+503\s+1\s+ProviderError: 503 endpoint down", errors)


def test_duckdb_groups_by_task_category_from_the_info_json(executed):
    cell = executed["duckdb"]
    # rollouts, scored, mean_reward, errored, prompt_tokens, completion_tokens, total_tokens
    assert row(cell, "run-a", "bfcl", "multiple") == [2, 2, 0.5, 0, 40, 55, 95]
    assert row(cell, "run-a", "bfcl", "simple_python") == [2, 2, 0.625, 0, 40, 18, 58]
    assert row(cell, "run-b", "arith", "arith") == [3, 2, 0.5, 1, 20, 10, 30]   # no task category: the environment
    assert row(executed["duckdb-rewards"], "arith", "correct") == [2, 0.5]
    assert row(executed["duckdb-rewards"], "bfcl", "correct") == [4, 0.5625]


def test_reward_tokens_and_latency_tables(executed):
    rewards = executed["reward-by-category"]   # rollouts, mean_reward, stderr; two runs: per run
    assert row(rewards, "arith", "arith", "run-b")[:2] == [2, 0.5]
    assert row(rewards, "bfcl", "multiple", "run-a")[:2] == [2, 0.5]
    assert row(rewards, "simple_python", "run-a")[:2] == [2, 0.625]
    tokens = executed["tokens"]
    judge = ["judge_prompt_tokens", "judge_completion_tokens"] if JUDGE_TOKENS else []
    assert header(tokens) == ["prompt_tokens", "completion_tokens", *judge, "per_rollout"]
    bfcl_judge = [100, 7] if JUDGE_TOKENS else []
    assert row(tokens, "bfcl", "run-a") == pytest.approx([80, 73, *bfcl_judge, (153 + sum(bfcl_judge)) / 4], abs=0.05)
    assert row(tokens, "arith", "run-b") == [20, 10, *[0] * len(judge), 10.0]
    latency = executed["latency"]   # calls, p50, p95, max, retries, failed
    assert row(latency, "bfcl", "m", "run-a") == [5, 300, 560, 600, 0, 0]
    assert row(latency, "arith", "m", "run-b") == [3, 1000, 1450, 1500, 2, 1]
    assert row(latency, "(all)", "(all)", "(all)")[:2] == [8, 350]


@pytest.mark.parametrize("case", ["missing", "empty", "unknown run"])
def test_no_rollouts_stops_at_the_first_data_cell_with_a_clear_message(case, dataset, tmp_path):
    (tmp_path / "empty" / "rollouts").mkdir(parents=True)
    traces, run_id = {"missing": (tmp_path / "nowhere", None), "empty": (tmp_path / "empty", None),
                      "unknown run": (dataset, "run-zzz")}[case]
    with pytest.raises(CellExecutionError) as caught:
        run_notebook(traces, tmp_path, run_id=run_id)
    error = caught.value
    assert error.ename == "FileNotFoundError"
    assert error.evalue.startswith(f"No rollouts{' of run ' + repr(run_id) if run_id else ''} "
                                   f"in the trace dataset at {traces.resolve()} ")
    assert "`scripts/run-main`" in error.evalue
    if run_id:
        assert "Runs in this dataset: run-a, run-b." in error.evalue


def test_plots_and_tables_keep_several_runs_apart(executed):
    assert "series:       run_id: run-a, run-b" in text(executed["load"])
    shown = figures(executed)
    assert shown["Mean reward by environment"]["legends"] == [["run-a", "run-b"], ["run-a", "run-b"]]
    assert shown["Tokens per rollout"]["legends"][0] == ["run-a", "run-b"]
    assert shown["Latency per model call"]["legends"] == [["run-a", "run-b"]]
    assert shown["Tokens per rollout"]["titles"][1] == "Total tokens by environment and run_id"


def test_plots_and_tables_keep_several_models_of_one_run_apart(executed_two_models):
    cells = executed_two_models
    assert "series:       model: model-x, model-y" in text(cells["load"])
    assert figures(cells)["Mean reward by environment"]["legends"][0] == ["model-x", "model-y"]
    rewards = cells["reward-by-category"]   # rollouts, mean_reward, stderr
    assert row(rewards, "arith", "arith", "model-x")[:2] == [2, 1.0]
    assert row(rewards, "model-y")[:2] == [2, 0.5]
    assert row(cells["latency"], "arith", "model-x") == [2, 150, 195, 200, 0, 0]


def test_one_run_of_one_model_is_not_split(executed_one_run):
    cells = executed_one_run
    assert "series:       one run of one model" in text(cells["load"])
    shown = figures(cells)
    assert shown["Mean reward by environment"]["legends"] == []
    assert row(cells["reward-by-category"], "bfcl", "multiple")[:2] == [2, 0.5]


@pytest.mark.parametrize("cells", ["executed", "executed_one_run", "executed_two_models"])
def test_no_legend_covers_a_bar(cells, request):
    shown = figures(request.getfixturevalue(cells))
    assert set(shown) == {"Mean reward by environment", "Tokens per rollout", "Latency per model call",
                          next(title for title in shown if title.startswith("Outcomes of"))}
    assert all(figure["bars"] for figure in shown.values())
    assert {title: figure["covered"] for title, figure in shown.items()} == dict.fromkeys(shown, 0)


def test_worst_tasks_come_first_errored_ones_before_zero_rewards(executed):
    table = text(executed["worst-tasks"])
    order = re.findall(r"\b(add-\d|multiple_\d|simple_python_\d)\b", table)
    assert order == ["add-2", "add-1", "multiple_1", "simple_python_1", "add-0", "multiple_0", "simple_python_0"]
    assert re.search(r"add-2\s+run-b\s+1\s+1\s+NaN\s+provider_error\s+endpoint down after 3 attempts", table)
    assert re.search(r"simple_python_1\s+run-a\s+1\s+0\s+0\.25\s+max_turns", table)


def compared_line(cell, label: str) -> list[str]:
    """The fields after ``label`` on the line of the comparison table that starts with it."""
    line = next(line for line in text(cell).splitlines() if line.startswith(label + " "))
    return line.removeprefix(label).split()


def test_compare_section_plots_each_environment_and_category_difference_with_its_interval(executed_nightlies):
    cells = executed_nightlies
    cell = cells["compare"]
    assert "A = night-1, B = night-2: 5 of 5 lines have paired rollouts" in text(cell)
    # n_paired, n_tasks, mean_a, mean_b, difference, ci_low, ci_high, p_value, only_in_a, only_in_b,
    # errored_a, errored_b, skipped_a, skipped_b, test
    simple = compared_line(cell, "bfcl / simple_python")
    assert [float(v) for v in simple[:8]] == [4, 4, 1.0, 0.25, -0.75, -1.0, -0.25, 0.25]   # McNemar: 2 * 1/8
    assert simple[-1] == "mcnemar_exact"
    arith = compared_line(cell, "arith")
    assert [float(v) for v in arith[:5]] == [2, 2, 0.5, 0.5, 0.0]
    assert [float(v) for v in arith[8:14]] == [0, 0, 0, 1, 0, 0]
    assert [float(v) for v in compared_line(cell, "bfcl")[:5]] == pytest.approx([6, 6, 5 / 6, 0.5, -1 / 3], abs=1e-4)
    assert "bfcl: pass -> fail ['s0', 's1', 's2'], fail -> pass ['m1']" in text(cell)
    figure = figures(cells)["Reward difference B − A with its 95% interval (A = night-1, B = night-2)"]
    assert figure["bars"] == 4   # 5 lines; arith's difference is 0: a bar of no width
    assert figure["legends"] == [["B worse (interval below 0)", "no clear difference", "B better (interval above 0)"]]
    assert figure["covered"] == 0


def test_compare_section_takes_the_runs_it_is_given(nightlies, tmp_path):
    cells = execute(nightlies, tmp_path, RUN_A="night-2", RUN_B="night-1")
    assert "A = night-2, B = night-1" in text(cells["compare"])
    assert [float(v) for v in compared_line(cells["compare"], "bfcl / simple_python")[2:5]] == [0.25, 1.0, 0.75]


def test_compare_section_explains_what_it_cannot_compare(executed, executed_two_models):
    assert ("Comparing needs two runs that share a rollout (environment, task, rollout index); the dataset holds "
            "run-a, run-b.") in text(executed["compare"])   # run-a: bfcl, run-b: arith
    assert "Comparing needs two runs that share a rollout" in text(executed_two_models["compare"])   # run-c only


def test_compare_section_takes_the_latest_runs_that_share_rollouts(nightlies, tmp_path):
    import shutil

    root = tmp_path / "traces"
    shutil.copytree(nightlies, root)
    writer = TraceWriter(root, "other-series")      # the latest run, on tasks no other run has
    late = trace("z0", 1.0, [call(50)], info={"task": {}})
    late.started_at = T0 + 3 * 86_400
    writer.add(late, rollout_index=0, environment="other", config_hash="h", elapsed_s=1.0)
    writer.flush()
    cell = execute(root, tmp_path / "kernel")["compare"]
    assert "A = night-1, B = night-2: 5 of 5 lines have paired rollouts" in text(cell)
