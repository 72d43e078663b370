"""Config models, TOML loading, scoring precedence and scoring.env templating."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from prefect_rollouts.config.agent import effective_scoring
from prefect_rollouts.config.env import resolve_env
from tests.fakes.openai_server import reply

pytestmark = pytest.mark.unit

SEED_TOML = """
[env.agent]
max_turns = 10
max_turn_tokens = 4096

[env.agent.scoring]
skip_on_truncated = true
skip_on_timeout = true
"""


def test_the_seed_toml_example_loads_as_written_and_means_what_the_seed_says():
    config = vf.load_config(SEED_TOML)
    assert config.model == "local/smollm2"                 # the embedded default model serves
    assert (config.max_turns, config.max_turn_tokens) == (10, 4096)
    assert (config.scoring.skip_on_truncated, config.scoring.skip_on_timeout) == (True, True)
    assert config.scoring.mode is None and config.scoring.retries.max_retries == 2
    assert effective_scoring(config.scoring, None).mode == "shared"


def test_load_config_reads_a_file_with_every_section(tmp_path):
    path = tmp_path / "eval.toml"
    path.write_text("""
[env.agent]
model = "some/model"
[env.agent.client]
base_url = "http://127.0.0.1:9/v1"
api_key_env = "MY_KEY"
[env.agent.sampling]
temperature = 0.0
tool_choice = "required"
[env.agent.harness]
id = "chat"
[env.agent.runtime]
network = "open"
[env.agent.timeouts]
agent = 30
[env.agent.scoring]
mode = "isolated"
network = "none"
env = { TOKEN = "${TOKEN:-x}" }
[env.agent.scoring.retries]
max_retries = 4
""")
    config = vf.load_config(path)
    assert config.client.api_key_env == "MY_KEY" and config.sampling.tool_choice == "required"
    assert config.harness.id == "chat" and config.timeouts.agent == 30
    assert config.scoring.network == vf.NetworkPolicy(mode="none") and config.scoring.retries.max_retries == 4


@pytest.mark.parametrize(("toml", "message"), [
    ('[env.agent]\nmodel = "m"\nmax_turn = 3', r"\[env.agent\] max_turn: unknown key"),
    ('[env.agent]\nmodel = "m"\n[env.agent.scoring]\nskip_on_truncatd = true',
     r"\[env.agent.scoring\] skip_on_truncatd: unknown key"),
    ('[env.agent]\nmodel = "m"\n[env.agent.scoring.retries]\nmax_retry = 1',
     r"\[env.agent.scoring.retries\] max_retry: unknown key"),
    ('[env.agent]\nmodel = "m"\nmax_turns = 0',
     r"\[env.agent\] max_turns = 0: Input should be greater than or equal to 1"),
    ('[env.agent]\nmodel = "m"\n[env.agent.harness]\nid = "bashful"', r"\[env.agent.harness\] id = 'bashful'"),
    ('[env]\nx = 1', r"\[env.agent\]: table not found"),
    ('[env.agent\nmodel = "m"', "not valid TOML"),
])
def test_bad_toml_names_the_key_and_its_section(toml, message):
    with pytest.raises(vf.ConfigError, match=message):
        vf.load_config(toml)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(vf.ConfigError, match="not found"):
        vf.load_config(tmp_path / "absent.toml")


def test_harness_accepts_the_string_shorthand():
    assert vf.AgentConfig(model="m", harness="chat").harness == vf.HarnessConfig(id="chat")
    assert vf.load_config('[env.agent]\nmodel = "m"\nharness = "chat"').harness.id == "chat"


def test_network_policy_accepts_the_string_shorthand_and_a_table_of_rules():
    assert vf.RuntimeConfig(network="none").network.mode == "none"
    assert vf.ScoringConfig(network="open").network == vf.NetworkPolicy()
    assert vf.RuntimeConfig(type="docker", network={"allow": ["pypi.org"]}).network.mode == "rules"
    with pytest.raises(ValueError, match="drop mode"):   # more in tests/core/test_network_policy.py
        vf.NetworkPolicy(mode="none", allow=["pypi.org"])


# The precedence table: task default, agent setting -> effective value.
@pytest.mark.parametrize(("task", "agent", "expected"), [
    (None, {}, {"mode": "shared", "skip_on_truncated": False}),
    ({"mode": "isolated"}, {}, {"mode": "isolated"}),
    ({"mode": "isolated"}, {"mode": "shared"}, {"mode": "shared"}),
    ({}, {"mode": "isolated"}, {"mode": "isolated"}),
    ({"skip_on_truncated": True}, {}, {"skip_on_truncated": True, "mode": "shared"}),
    ({"skip_on_truncated": True}, {"skip_on_truncated": False}, {"skip_on_truncated": False}),
    ({"network": "none"}, {}, {"network": vf.NetworkPolicy(mode="none")}),
    ({"network": "none"}, {"network": "open"}, {"network": vf.NetworkPolicy(mode="open")}),
    ({"retries": {"max_retries": 5}}, {}, {"retries": vf.RetryConfig(max_retries=5)}),
    ({"retries": {"max_retries": 5}}, {"retries": {"max_retries": 0}}, {"retries": vf.RetryConfig(max_retries=0)}),
    ({"env": {"A": "task", "B": "task"}}, {"env": {"B": "agent", "C": "agent"}},
     {"env": {"A": "task", "B": "agent", "C": "agent"}}),
    ({"runtime": {"exec_timeout_s": 5}}, {}, {"runtime": vf.RuntimeConfig(exec_timeout_s=5)}),
])
def test_scoring_precedence_agent_fields_that_are_set_override_task_defaults(task, agent, expected):
    task_config = None if task is None else vf.ScoringConfig(**task)
    effective = effective_scoring(vf.ScoringConfig(**agent), task_config)
    for key, value in expected.items():
        assert getattr(effective, key) == value, key


def test_an_agent_default_does_not_override_a_task_setting():
    agent = vf.AgentConfig(model="m").scoring       # nothing set explicitly
    task = vf.ScoringConfig(mode="isolated", skip_on_timeout=True)
    effective = effective_scoring(agent, task)
    assert (effective.mode, effective.skip_on_timeout) == ("isolated", True)


def test_env_templates_resolve_from_the_host_environment():
    host = {"TOKEN": "abc", "EMPTY": ""}
    env = {"A": "${TOKEN}", "B": "pre-${TOKEN}-post", "C": "${MISSING:-fallback}", "D": "${EMPTY:-used}",
           "E": "${MISSING:-}", "F": "plain"}
    assert resolve_env(env, host) == {"A": "abc", "B": "pre-abc-post", "C": "fallback", "D": "used", "E": "",
                                      "F": "plain"}


def test_an_unset_variable_without_default_is_an_error_naming_it():
    with pytest.raises(vf.ScoringEnvError, match=r'scoring.env.TOKEN = "\$\{JUDGE_TOKEN\}": JUDGE_TOKEN is not set'):
        resolve_env({"TOKEN": "${JUDGE_TOKEN}"}, {})


async def test_scoring_env_reaches_scoring_commands_and_a_missing_variable_is_a_scoring_error(
        openai_server, agent_config, monkeypatch):
    class ReadsEnv(vf.Task):
        @vf.reward
        async def token(self, runtime):
            result = await runtime.exec("printf %s \"$TOKEN\"")
            return float(result.stdout == "from-host")

    openai_server.default = reply("ok")
    monkeypatch.setenv("HOST_TOKEN", "from-host")
    good = agent_config(scoring=vf.ScoringConfig(env={"TOKEN": "${HOST_TOKEN}"}))
    bad = agent_config(scoring=vf.ScoringConfig(env={"TOKEN": "${NOT_SET_ANYWHERE}"}))
    async with vf.make_agent(good) as agent:
        scored = await agent.run(ReadsEnv(vf.TaskData(prompt="x")))
    async with vf.make_agent(bad) as agent:
        failed = await agent.run(ReadsEnv(vf.TaskData(prompt="x")))
    assert scored.reward == 1.0
    assert failed.reward is None and failed.errors[0].type == "ScoringEnvError"
    assert "NOT_SET_ANYWHERE is not set" in failed.errors[0].message and failed.stop_condition == "scoring_error"


def test_an_eval_has_one_orchestration_setting_rollout_granularity():
    from prefect_rollouts.config.eval import load_eval_config

    base = '[env.taskset]\nid = "arithmetic"\n[env.agent]\nmodel = "m"\n'
    assert load_eval_config(base + 'orchestrator = "prefect"').env.agent.orchestrator == "prefect"
    with pytest.raises(vf.ConfigError, match=r'\[env.agent\] orchestrator = "inline": an eval always runs as a '
                                             r"Prefect flow, and rollout_granularity alone decides"):
        load_eval_config(base + 'orchestrator = "inline"')


def test_literal_env_values_read_as_stars_in_every_json_dump_and_templates_stay():
    from prefect_rollouts.config.eval import load_eval_config

    config = load_eval_config('[env.taskset]\nid = "arithmetic"\n[env.agent]\nmodel = "m"\n[env.agent.runtime]\n'
                              'env = { TOKEN = "sk-Lit3ral9", HOME_DIR = "${HOME}" }\n')
    assert config.model_dump(mode="json")["env"]["agent"]["runtime"]["env"] == {"TOKEN": "***", "HOME_DIR": "${HOME}"}
    assert "sk-Lit3ral9" not in config.model_dump_json()
    assert config.env.agent.runtime.env["TOKEN"] == "sk-Lit3ral9"     # the value itself is kept in memory


def test_a_launch_form_and_a_work_pool_refuse_literal_env_values():
    import pytest

    from prefect_rollouts.config.eval import load_eval_config
    from prefect_rollouts.errors import ConfigError
    from prefect_rollouts.evals.identity import check_portable
    from prefect_rollouts.evals.launch_form import LaunchForm

    config = load_eval_config('[env.taskset]\nid = "arithmetic"\n[env.agent]\nmodel = "m"\n[env.agent.scoring]\n'
                              'env = { TOKEN = "sk-Lit3ral9" }\n')
    with pytest.raises(ConfigError, match=r"env.agent.scoring.env.TOKEN: a launch form cannot carry"):
        LaunchForm.from_eval_config(config)
    with pytest.raises(ConfigError, match=r"env.agent.scoring.env.TOKEN: a work pool's shard flow runs cannot carry"):
        check_portable(config, "a work pool's shard flow runs")
