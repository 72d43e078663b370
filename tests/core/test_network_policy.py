"""Issue 23: network policies as config — rules, bad input, composition with a task's default, the
local runtime's refusal (``config/network.py``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prefect_rollouts import AgentConfig, NetworkPolicy
from prefect_rollouts.config.network import compose, is_special_address, parse_rule
from prefect_rollouts.errors import ConfigError

pytestmark = pytest.mark.unit


def policy(**table: object) -> NetworkPolicy:
    return NetworkPolicy.model_validate(table)


def test_strings_and_tables_give_the_three_modes():
    assert NetworkPolicy.model_validate("none").mode == "none"
    assert NetworkPolicy.model_validate("open").mode == "open"
    rules = policy(allow=["PyPI.org", "*.pythonhosted.org", "http://10.1.2.3:8080"])
    assert rules.mode == "rules" and rules.allow == ["pypi.org", "*.pythonhosted.org", "http://10.1.2.3:8080"]
    assert policy(block=["evil.example"]).allow is None   # allow left out: every host but the blocked
    assert policy(allow=[]).allow == []
    with pytest.raises(ValidationError, match="drop mode"):
        policy(mode="none", allow=["pypi.org"])
    for dumped in (NetworkPolicy(), NetworkPolicy(mode="none"), rules, policy(allow=[])):   # stored runs round-trip
        assert NetworkPolicy.model_validate(dumped.model_dump(mode="json")) == dumped
    assert policy(mode="none", allow=[]).mode == "none"   # as a run config stored before rules has it


@pytest.mark.parametrize(("rule", "scheme", "host", "port", "expected"), [
    ("pypi.org", "https", "pypi.org", 443, True),
    ("pypi.org", "http", "pypi.org", 80, True),
    ("pypi.org", "https", "pypi.org", 8443, False),          # a bare host: ports 80 and 443 only
    ("pypi.org", "https", "files.pypi.org", 443, False),
    ("*.example.com", "https", "example.com", 443, True),   # a glob also matches its apex
    ("*.example.com", "https", "a.b.example.com", 443, True),
    ("*.example.com", "https", "badexample.com", 443, False),
    ("example.com:8080", "http", "example.com", 8080, True),
    ("example.com:8080", "https", "example.com", 8080, True),
    ("https://api.example.com", "https", "api.example.com", 443, True),
    ("https://api.example.com", "http", "api.example.com", 80, False),   # the scheme must match
    ("http://10.1.2.3:8080", "http", "10.1.2.3", 8080, True),
    ("http://10.1.2.3:8080", "https", "10.1.2.3", 8080, False),
    ("*", "https", "anything.example", 7, True),
])
def test_a_rule_matches_its_hosts_ports_and_schemes(rule, scheme, host, port, expected):
    assert parse_rule(rule).matches(scheme, host, port) is expected


@pytest.mark.parametrize(("rule", "says"), [
    ("*.", "a glob needs a domain"),
    ("http://", "no host"),
    ("https://pypi.org/simple", "not a path"),
    ("pypi.org/simple", "not a path"),
    ("pypi.org:0", "from 1 to 65535"),
    ("pypi.org:65536", "from 1 to 65535"),
    ("pypi.org:http", "must be a number"),
    ("ftp://pypi.org", "use http:// or https://"),
    ("py*.org", "only a leading"),
    ("[::1]:80", "IPv6 is off"),
    ("", "no host"),
])
def test_a_malformed_rule_is_a_config_error_naming_it(rule, says):
    with pytest.raises(ValueError, match=says) as caught:
        parse_rule(rule)
    assert repr(rule) in str(caught.value)
    with pytest.raises(ValidationError, match=says):
        policy(allow=[rule])


def test_a_trailing_dot_is_a_fully_qualified_name_and_ports_are_ascii_digits():
    assert parse_rule("PyPI.org.").text == "pypi.org" and parse_rule("pypi.org.:8080").text == "pypi.org:8080"
    with pytest.raises(ValueError, match="must be a number"):
        parse_rule("pypi.org:\uff18\uff10")   # full-width 80


def test_block_wins_and_a_dead_allow_rule_is_explained():
    carve_out = policy(allow=["*.example.com"], block=["api.example.com"])
    assert carve_out.decide("https", "www.example.com", 443)[0]
    allowed, reason, _ = carve_out.decide("https", "api.example.com", 443)
    assert not allowed and "blocked by rule 'api.example.com'" in reason
    with pytest.raises(ValidationError, match="wholly inside block rule"):
        policy(allow=["api.example.com"], block=["*.example.com"])
    with pytest.raises(ValidationError, match="blocks everything"):
        policy(allow=["pypi.org"], block=["*"])
    with pytest.raises(ValidationError, match="blocks everything"):
        policy(block=["*"])
    assert not policy(block=["evil.example"]).decide("https", "evil.example", 8443)[0]   # a bare block: every port
    assert policy(allow=["api.example.com"], block=["api.example.com:8443"]).decide("https", "api.example.com", 443)[0]
    with pytest.raises(ValidationError, match="wholly inside"):
        policy(allow=["api.example.com:8443"], block=["api.example.com"])
    allowed, reason, _ = policy(allow=[]).decide("https", "pypi.org", 443)
    assert not allowed and "lets nothing through" in reason


def test_a_task_default_composes_with_the_agents_policy():
    agent = policy(allow=["pypi.org", "api.example.com"], block=["x.example"])
    task = policy(allow=["api.example.com", "other.example"], block=["y.example"])
    joined = compose(agent, task)
    assert joined.allow == ["api.example.com"] and joined.block == ["x.example", "y.example"]
    assert compose(NetworkPolicy(), task) == task                     # the agent left it open: the task's
    assert compose(agent, NetworkPolicy()) == agent                   # the task is open: the agent's
    assert compose(policy(block=["x.example"]), task).allow == task.allow   # allow ["*"] takes the other list
    assert compose(agent, NetworkPolicy(mode="none")).mode == "none"
    assert compose(agent, None) is agent


def test_special_addresses_are_told_apart():
    assert is_special_address("127.0.0.1") and is_special_address("169.254.169.254") and is_special_address("0.0.0.0")
    assert not is_special_address("10.1.2.3") and not is_special_address("pypi.org")
    assert parse_rule("127.0.0.1:8080").exact and not parse_rule("*").exact and not parse_rule("*.a.com").exact


def test_the_local_runtime_refuses_rules_before_any_rollout():
    with pytest.raises(ValidationError, match='type = "docker"'):
        AgentConfig(model="m", runtime={"network": {"allow": ["pypi.org"]}})
    with pytest.raises(ValidationError, match=r"\[env.agent.scoring\] network"):
        AgentConfig(model="m", scoring={"network": {"allow": []}})
    AgentConfig(model="m", runtime={"type": "docker", "network": {"allow": []}}, scoring={"network": {"allow": []}})


def test_toml_names_the_rule_in_the_error(tmp_path):
    from prefect_rollouts import load_config

    path = tmp_path / "agent.toml"
    path.write_text('[env.agent]\nmodel = "m"\n[env.agent.runtime]\ntype = "docker"\n'
                    'network = { allow = ["https://pypi.org/simple"] }\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "https://pypi.org/simple" in str(caught.value) and "network" in str(caught.value)
