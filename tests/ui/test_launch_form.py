"""The launch form (LaunchForm): its shape in Prefect's parameter schema and the config it launches."""

from __future__ import annotations

import importlib
import inspect
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.environments import BUILTIN
from prefect_rollouts.environments.bfcl.taskset import CATEGORIES
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.launch_form import AdvancedSettings, LaunchForm, LimitSettings
from prefect_rollouts.evals.launch_tasksets import BUILTIN_TASKSETS, BfclCategory, BfclTaskset, CustomTaskset

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def form_schema() -> dict:
    """The launch flow's parameter schema, as Prefect stores it on the deployment and the UI renders it."""
    from prefect.utilities.callables import parameter_schema

    from prefect_rollouts.flows.launch import launch_flow

    return parameter_schema(launch_flow.fn).model_dump()


def form_models() -> list[type[BaseModel]]:
    return [LaunchForm, LimitSettings, AdvancedSettings, *BUILTIN_TASKSETS.values(), CustomTaskset]


def test_the_form_shows_the_common_fields_first_and_the_rest_under_advanced():
    schema = form_schema()
    assert list(schema["properties"]) == ["eval"]
    definitions = schema["definitions"]
    form = definitions[schema["properties"]["eval"]["$ref"].rsplit("/", 1)[1]]
    # Prefect's form orders fields by "position" alone: a server on PostgreSQL (JSONB) reorders the keys
    fields = sorted(form["properties"].values(), key=lambda field: field["position"])
    titles = [field.get("title") or definitions[field["$ref"].rsplit("/", 1)[1]]["title"]
              for field in fields]   # a $ref field shows its model's title
    assert titles == ["Taskset", "Model", "Endpoint", "Number of tasks", "Rollouts per task", "Concurrency",
                      "More tasksets (a suite)", "Limits", "Advanced"]
    assert "run_name" not in form["properties"]     # Prefect's own "Run Name" is the only one up there
    advanced = definitions["AdvancedSettings"]["properties"]
    assert advanced["run_name"]["title"] == "Run id prefix"
    assert len(advanced) <= 16
    # a plain union (anyOf): Prefect shows a switch of the tasksets, each with its own option fields
    variants = [definitions[ref["$ref"].rsplit("/", 1)[1]] for ref in form["properties"]["taskset"]["anyOf"]]
    assert [variant["title"] for variant in variants] == ["arithmetic", "bfcl", "humaneval", "harbor",
                                                            "custom (import path)"]
    for definition in definitions.values():
        assert [field["position"] for field in definition["properties"].values()] == list(
            range(len(definition["properties"])))
    assert list(variants[0]["properties"]) == ["id", "count", "seed", "max_value"]
    assert variants[1]["properties"]["category"]["enum"][0] == "simple_python"


@pytest.mark.parametrize("model", form_models(), ids=lambda model: model.__name__)
def test_every_field_has_a_title_and_a_description_that_gives_its_default(model):
    for name, field in model.model_fields.items():
        where, default = f"{model.__name__}.{name}", field.default
        assert field.title, where
        if name == "id" or field.is_required() or isinstance(default, BaseModel):
            continue
        assert field.description, where
        if default is None or default == "":
            assert "Empty: " in field.description, where
        else:
            spelled = {"{}" if default == {} else str(default), f"{default:g}" if isinstance(default, float) else ""}
            assert any(f"Default {s}." in field.description for s in spelled if s), where


@pytest.mark.parametrize("taskset_id", sorted(BUILTIN))
def test_each_built_in_tasksets_form_has_its_loaders_options_and_defaults(taskset_id):
    module, _, function = BUILTIN[taskset_id].partition(":")
    loader = getattr(importlib.import_module(module), function)
    parameters = inspect.signature(loader).parameters
    fields = {name: field for name, field in BUILTIN_TASKSETS[taskset_id].model_fields.items() if name != "id"}
    assert list(fields) == list(parameters)
    assert {name: field.default for name, field in fields.items()} == {n: p.default for n, p in parameters.items()}


def test_the_bfcl_form_offers_exactly_the_bfcl_categories():
    from prefect_rollouts.environments.bfcl.taskset import CATEGORIES

    assert typing.get_args(BfclTaskset.model_fields["category"].annotation) == CATEGORIES


def test_a_filled_form_launches_the_config_it_shows():
    form = LaunchForm.model_validate({
        "taskset": {"id": "bfcl", "category": "multiple", "count": 7}, "model": "gpt-x",
        "endpoint": "http://10.0.0.5:8000/v1", "num_tasks": 3, "rollouts_per_task": 2, "max_concurrent": 5,
        "advanced": {"run_name": "try", "rollout_granularity": "batch", "harness": "chat", "max_turn_tokens": 64,
                     "temperature": 0.2, "api_key_env": "", "traces_path": "/data/traces",
                     "overrides": {"env.agent.timeouts.agent": 300, "env.agent.sampling.top_p": 0.9}}})
    config = form.to_eval_config()
    agent = config.env.agent
    assert (config.env.taskset.id, config.env.taskset.options) == ("bfcl", {"category": "multiple", "count": 7})
    assert (config.run_name, config.num_tasks, config.rollouts_per_task, config.max_concurrent) == ("try", 3, 2, 5)
    assert (config.rollout_granularity, config.traces.path, config.traces.store) == ("batch", "/data/traces", None)
    assert (agent.model, agent.client.base_url, agent.client.endpoint, agent.client.api_key_env) == (
        "gpt-x", "http://10.0.0.5:8000/v1", None, None)
    assert (agent.harness.id, agent.max_turn_tokens, agent.sampling.temperature, agent.sampling.top_p) == (
        "chat", 64, 0.2, 0.9)
    assert agent.timeouts.agent == 300


def test_the_endpoint_names_a_block_or_a_url_without_credentials():
    config = LaunchForm(endpoint="prod-llm").to_eval_config()
    assert (config.env.agent.client.endpoint, config.env.agent.client.base_url) == ("prod-llm", "http://127.0.0.1:8000/v1")
    custom = LaunchForm(taskset=CustomTaskset(loader="tests.prefect.tasksets:numbers", options={"n": 4}))
    assert (custom.to_eval_config().env.taskset.id, custom.to_eval_config().env.taskset.options) == (
        "tests.prefect.tasksets:numbers", {"n": 4})
    with pytest.raises(ConfigError, match="endpoint: the URL carries credentials") as caught:
        LaunchForm(endpoint="https://me:sk-secret@api.example.com/v1").to_eval_config()
    assert "sk-secret" not in str(caught.value)


@pytest.mark.parametrize(("key", "message"), [
    ("env.agent.model", r'overrides\["env.agent.model"\]: the form has a field for it \(model\)'),
    ("env.agent.client", r'overrides\["env.agent.client"\]: the form has a field for it'),
    ("env.taskset.count", r'overrides\["env.taskset.count"\]: the form has a field for it \(taskset\)'),
    ("env.agent.bogus", r"\[env.agent\] bogus: unknown key"),
])
def test_an_override_of_a_field_in_the_form_or_of_no_config_key_is_refused(key, message):
    with pytest.raises(ConfigError, match=message):
        LaunchForm(advanced=AdvancedSettings(overrides={key: 1})).to_eval_config()


@pytest.mark.parametrize("example", sorted(path.name for path in (REPO / "examples").glob("*.toml")))
def test_every_example_config_launches_as_itself_from_its_form(example):
    config = load_eval_config(REPO / "examples" / example)
    again = LaunchForm.from_eval_config(config).to_eval_config()
    tasksets = {"env": {"taskset", "tasksets"}}
    assert again.model_dump(exclude=tasksets) == config.model_dump(exclude=tasksets)
    for mine, theirs in zip(again.environments(), config.environments(), strict=True):   # a suite: each entry
        assert (mine.name, mine.taskset, mine.num_tasks, mine.agent) == (
            theirs.name, theirs.taskset, theirs.num_tasks, theirs.agent)
        assert {key: mine.options[key] for key in theirs.options} == theirs.options   # + the loader's defaults


def test_a_config_with_header_values_cannot_become_a_form():
    config = load_eval_config(REPO / "examples" / "nightly.toml", ['env.agent.client.headers={"X-Key" = "s3cret"}'])
    with pytest.raises(ConfigError, match="headers: a launch form cannot carry header values") as caught:
        LaunchForm.from_eval_config(config)
    assert "s3cret" not in str(caught.value)


def test_the_nightly_deployment_launches_examples_nightly_toml():
    deployment = next(d for d in yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())["deployments"]
                      if d["name"] == "nightly-eval")
    form = LaunchForm.model_validate(deployment["parameters"]["eval"])
    assert form == LaunchForm.from_eval_config(load_eval_config(REPO / "examples" / "nightly.toml"))
    assert (form.model, form.endpoint, form.taskset.id) == ("local/smollm2", "", "arithmetic")   # runs as it is


def test_the_form_offers_exactly_the_bfcl_categories_the_taskset_supports():
    assert typing.get_args(BfclCategory) == CATEGORIES


def test_the_form_finishes_a_run_with_budgets_and_attempts_of_its_own_and_retry_types_in_other_keys():
    form = LaunchForm.model_validate({
        "limits": {"max_rollout_attempts": 3, "token_budget": 50_000, "cost_budget_usd": 2.5},
        "advanced": {"finish_run": "nightly-1", "overrides": {
            "retry_error_types": ["ProviderError"], "env.agent.client.price": {"input": 3.0, "output": 15.0}}}})
    config = form.to_eval_config()
    assert (form.advanced.finish_run, config.max_rollout_attempts, config.retry_error_types) == (
        "nightly-1", 3, ["ProviderError"])
    assert (config.token_budget, config.cost_budget_usd) == (50_000, 2.5)
    assert LaunchForm.from_eval_config(config).limits == form.limits             # and back
    assert LaunchForm().to_eval_config().token_budget is None                      # empty: no budget
    with pytest.raises(ConfigError, match=r'overrides\["token_budget"\]: the form has a field for it \(limits'):
        LaunchForm(advanced=AdvancedSettings(overrides={"token_budget": 5})).to_eval_config()
    with pytest.raises(ConfigError, match="cost_budget_usd"):   # a cost budget needs the client's price
        LaunchForm(limits=LimitSettings(cost_budget_usd=1.0)).to_eval_config()
    assert LaunchForm.model_validate({"advanced": {"finish_run": None}}).advanced.finish_run == ""
    with pytest.raises(ConfigError, match="'Providererror' is not an error type a rollout records"):
        LaunchForm(advanced=AdvancedSettings(overrides={"retry_error_types": ["Providererror"]})).to_eval_config()


def test_a_deployment_of_the_eval_flow_takes_retry_errors_as_parameters():
    from prefect_rollouts.flows.eval import eval_flow

    properties = eval_flow.parameters.model_dump()["properties"]
    assert properties["retry_errors"]["default"] is False
    assert "ProviderError" in properties["retry_error_types"]["description"]
