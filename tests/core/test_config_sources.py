"""Where config keys come from and which wins (config/sources.py)."""

from __future__ import annotations

import pytest

from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.config.sources import Source, merge, set_source, toml_source, validate_sources
from prefect_rollouts.errors import ConfigError

TOML = ('[env.taskset]\nid = "arithmetic"\ncount = 5\n[env.agent]\nmodel = "m"\n'
        '[env.agent.sampling]\ntemperature = 0.5\n')

pytestmark = pytest.mark.unit


def test_later_sources_win_key_by_key_and_tables_merge():
    merged = merge([toml_source(TOML), set_source(["env.agent.sampling.top_p=0.9", "max_concurrent=3"]),
                    Source("the launch form", sets=[(["env", "agent", "model"], "n")])])
    assert merged["env"]["agent"] == {"model": "n", "sampling": {"temperature": 0.5, "top_p": 0.9}}
    assert merged["max_concurrent"] == 3 and merged["env"]["taskset"] == {"id": "arithmetic", "count": 5}


def test_a_set_replaces_a_whole_value_a_table_of_data_merges():
    base = Source("stored", {"env": {"agent": {"sampling": {"temperature": 0.5}}, "tasksets": [{"id": "a"}]}})
    replaced = merge([base, set_source(['env.agent.sampling={top_p = 0.9}', 'env.tasksets=[{id = "b"}]'])])
    assert replaced["env"]["agent"]["sampling"] == {"top_p": 0.9} and replaced["env"]["tasksets"] == [{"id": "b"}]
    merged = merge([base, Source("more", {"env": {"agent": {"sampling": {"top_p": 0.9}}}})])
    assert merged["env"]["agent"]["sampling"] == {"temperature": 0.5, "top_p": 0.9}
    assert base.data["env"]["agent"]["sampling"] == {"temperature": 0.5}, "sources are not changed"


def test_bad_sets_name_their_source_and_key():
    with pytest.raises(ConfigError, match=r"--set 'max_concurrent': expected dotted.key=value"):
        set_source(["max_concurrent"])
    with pytest.raises(ConfigError, match=r"--set env.agent.model.name: 'model' is a value, not a table"):
        merge([toml_source(TOML), set_source(["env.agent.model.name=x"])])
    with pytest.raises(ConfigError, match=r"\[env.agent\] max_turn: unknown key"):
        validate_sources(EvalConfig, [toml_source(TOML), set_source(["env.agent.max_turn=3"])])
