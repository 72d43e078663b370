"""TOML nested past ``MAX_JSON_DEPTH`` (issue 32): a config file, a ``--set`` value or key, a rubric
file and a Harbor ``task.toml`` are refused naming what they are, where ``tomllib`` (or the code
after it) ended in a ``RecursionError`` traceback; TOML at the bound still loads."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import prefect_rollouts as vf
from prefect_rollouts.cli import app
from prefect_rollouts.config.sources import merge, set_source, toml_source
from prefect_rollouts.environments import load_taskset
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.nesting import MAX_JSON_DEPTH
from tests.environments.test_harbor import make_task

pytestmark = pytest.mark.unit

DEEP = 5_000   # past the interpreter's recursion limit (1,000); tomllib takes seconds for 100,000 dotted keys
TOO_DEEP = "deeper than 128 levels (MAX_JSON_DEPTH)"

# a document nested DEEP levels three ways: arrays, inline tables, dotted table names
DOCUMENTS = {
    "arrays": "x = " + "[" * DEEP + "]" * DEEP + "\n",
    "inline tables": "x = " + "{a = " * DEEP + "1" + "}" * DEEP + "\n",
    "dotted tables": "[" + ".".join(["a"] * DEEP) + "]\n",
}


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def _list(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("text", DOCUMENTS.values(), ids=DOCUMENTS)
def test_a_config_file_nested_too_deep_is_a_config_error_naming_the_file(tmp_path, text):
    path = tmp_path / "deep.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        toml_source(path)
    assert str(raised.value) == (f"config file {str(path)!r} nests {TOO_DEEP}. "
                                 "Write it with fewer levels of tables and arrays")
    with pytest.raises(ConfigError, match=r"TOML text nests deeper than 128 levels"):
        toml_source(text)


def test_a_config_at_the_bound_loads():
    # the document's table is level 1, then x's arrays: 127 of them reach the bound
    assert toml_source("x = " + _nested(MAX_JSON_DEPTH - 1)).data["x"] == _list(MAX_JSON_DEPTH - 1)
    with pytest.raises(ConfigError, match=TOO_DEEP.replace("(", r"\(").replace(")", r"\)")):
        toml_source("x = " + _nested(MAX_JSON_DEPTH))


def test_eval_with_a_config_file_nested_too_deep_exits_2_naming_it(tmp_path):
    path = tmp_path / "deep_eval.toml"
    path.write_text(DOCUMENTS["arrays"])
    result = CliRunner().invoke(app, ["eval", str(path)])
    assert result.exit_code == 2, result.output
    assert f"config file {str(path)!r} nests deeper than 128 levels" in " ".join(result.output.split())


def test_a_set_value_nested_too_deep_names_its_key():
    with pytest.raises(ConfigError) as raised:
        set_source([f"env.x={_nested(5000)}"])
    assert str(raised.value).startswith(f"--set env.x: the key and value nest {TOO_DEEP}.")
    # the key's levels count: env.x sits at level 3, so its value may have 126 levels
    assert merge([set_source([f"env.x={_nested(MAX_JSON_DEPTH - 2)}"])])["env"]["x"] == \
        _list(MAX_JSON_DEPTH - 2)
    with pytest.raises(ConfigError, match=r"--set env.x: the key and value nest deeper"):
        set_source([f"env.x={_nested(MAX_JSON_DEPTH - 1)}"])


def test_a_set_key_nested_too_deep_is_refused_with_the_key_cut():
    key = ".".join(["a"] * 5000)
    with pytest.raises(ConfigError) as raised:
        set_source([f"{key}=1"])
    message = str(raised.value)
    assert message.startswith(f"--set {key[:80]}... ({len(key)} characters): the key nests {TOO_DEEP}.")
    assert len(message) < 300


def test_eval_with_a_set_nested_too_deep_exits_2_naming_the_key():
    result = CliRunner().invoke(app, ["eval", "examples/arithmetic.toml", "--set", f"env.x={_nested(5000)}"])
    assert result.exit_code == 2, result.output
    assert "--set env.x: the key and value nest deeper" in " ".join(result.output.split())


def test_a_rubric_file_nested_too_deep_is_a_config_error(tmp_path):
    for name, text in [("rubric.toml", DOCUMENTS["arrays"]), ("rubric.json", '{"criteria": ' + _nested(DEEP) + "}")]:
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match=r"cannot read it \(the file nests deeper than 128 levels"):
            vf.load_config(f'[env.agent]\nmodel = "m"\n[[env.agent.scoring.judges]]\nid = "rubric"\nmodel = "j"\n'
                           f'rubric = "{tmp_path / name}"\n')


@pytest.mark.parametrize("text", DOCUMENTS.values(), ids=DOCUMENTS)
def test_a_task_toml_nested_too_deep_is_refused_naming_the_task(tmp_path, text):
    make_task(tmp_path, "deep", text)
    with pytest.raises(ConfigError) as raised:
        load_taskset("harbor", {"path": str(tmp_path)})
    assert str(raised.value) == (f"Harbor task 'deep' ({tmp_path / 'deep'}): task.toml nests {TOO_DEEP}. "
                                 "Write it with fewer levels of tables and arrays")


def test_tasks_check_lists_a_task_toml_nested_too_deep_and_exits_2(tmp_path):
    make_task(tmp_path, "deep", DOCUMENTS["inline tables"])
    make_task(tmp_path, "fine")
    result = CliRunner().invoke(app, ["tasks", "check", str(tmp_path)])
    output = "".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "Harbortask'deep'" in output and "task.tomlnestsdeeperthan128levels" in output
    assert "1taskdirectoriesdonotload" in output
