"""Judges: reference and rubric plugins against the scripted server (real sockets), failures as
scoring errors, plugins by import path, bookkeeping on the trace and in Parquet rows."""

from __future__ import annotations

import json

import pytest

import prefect_rollouts as vf
from prefect_rollouts.traces.schema import rollout_row
from tests.fakes.openai_server import reply, status
from tests.support.ports import free_port

pytestmark = pytest.mark.unit

JUDGE_USAGE = {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42}


class Capital(vf.Task):
    @vf.reward(weight=0.5)
    def mentions_paris(self, trace):
        return "paris" in trace.last_reply.lower()


def capital(answer="Paris", **fields):
    return Capital(vf.TaskData(prompt="What is the capital of France?", answer=answer, **fields))


@pytest.fixture
def judged(agent_config, openai_server):
    """Factory of an agent config with ``judges`` aimed at the scripted server (model "judge")."""
    def make(*judges: dict, **fields) -> vf.AgentConfig:
        client = {"base_url": openai_server.base_url, "api_key_env": "",
                  "retries": {"max_retries": 1, "backoff_s": 0.01}}
        configured = [{"model": "judge", "client": client, **judge} for judge in judges]
        scoring = vf.ScoringConfig.model_validate({**fields.pop("scoring", {}), "judges": configured})
        return agent_config(scoring=scoring, **fields)
    return make


def judge_requests(server):
    return [r for r in server.requests if r.body.get("model") == "judge"]


async def test_reference_judge_yes_is_a_reward_with_its_call_and_usage_on_the_trace(openai_server, judged):
    openai_server.play([reply("It is Paris.", usage={"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}),
                        reply("Yes.", usage=JUDGE_USAGE)])
    async with vf.make_agent(judged({"id": "reference", "weight": 2.0})) as agent:
        trace = await agent.run(capital())
    assert trace.rewards == {"mentions_paris": 1.0, "reference": 1.0}
    assert trace.reward_weights == {"mentions_paris": 0.5, "reference": 2.0} and trace.reward == 2.5
    (call,) = trace.judge_calls
    assert (call.judge, call.model, call.verdict, call.reply, call.error) == ("reference", "judge", "yes", "Yes.", None)
    assert (call.prompt_tokens, call.completion_tokens, call.status_code) == (40, 2, 200) and call.latency_ms > 0
    assert (trace.judge_usage.prompt_tokens, trace.judge_usage.completion_tokens) == (40, 2)
    assert (trace.usage.prompt_tokens, trace.usage.completion_tokens) == (9, 4)   # the agent's own
    (request,) = judge_requests(openai_server)
    prompt = request.messages[0]["content"]
    assert request.body["temperature"] == 0.0 and "tools" not in request.body
    assert "What is the capital of France?" in prompt and "\nParis\n" in prompt and "It is Paris." in prompt
    assert call.prompt == prompt
    row = rollout_row(trace, rollout_index=0, environment="e", config_hash="h", elapsed_s=1.0)
    assert (row["judge_prompt_tokens"], row["judge_completion_tokens"], row["num_judge_calls"]) == (40, 2, 1)
    assert row["prompt_tokens"] == 9 and json.loads(row["rewards"])["reference"] == 1.0
    assert vf.Trace.model_validate_json(trace.model_dump_json()).judge_calls == trace.judge_calls


@pytest.mark.parametrize("verdict, expected", [("no", 0.0), ("**No**", 0.0), ("Reasoning...\nVerdict: yes", 1.0),
                                               ("The answer matches, so yes", 1.0)])
async def test_reference_verdicts_are_parsed_leniently(openai_server, judged, verdict, expected):
    openai_server.play([reply("Paris"), reply(verdict)])
    async with vf.make_agent(judged({"id": "reference"})) as agent:
        trace = await agent.run(capital())
    assert trace.rewards["reference"] == expected and trace.errors == []


async def test_a_list_answer_accepts_any_item_and_a_custom_prompt_fills_its_fields(openai_server, judged):
    openai_server.play([reply("Lutetia"), reply("yes")])
    prompt = 'Q: {question} | A: {answer} | R: {response} | {"json": "kept"} {unknown}'
    async with vf.make_agent(judged({"id": "reference", "prompt": prompt})) as agent:
        trace = await agent.run(capital(answer=["Paris", "Lutetia"]))
    assert trace.rewards["reference"] == 1.0
    assert judge_requests(openai_server)[0].messages[0]["content"] == (
        'Q: What is the capital of France? | A: Any of:\n- Paris\n- Lutetia | R: Lutetia | {"json": "kept"} {unknown}')


async def test_an_empty_reply_scores_zero_without_a_judge_call(openai_server, judged):
    openai_server.play([reply("")])
    async with vf.make_agent(judged({"id": "reference"})) as agent:
        trace = await agent.run(capital())
    assert trace.rewards == {"mentions_paris": 0.0, "reference": 0.0} and trace.judge_calls == []
    assert judge_requests(openai_server) == []


async def test_an_unparseable_verdict_is_a_scoring_error_never_zero(openai_server, judged):
    openai_server.play([reply("Paris"), reply("Hard to say.", usage=JUDGE_USAGE)])
    async with vf.make_agent(judged({"id": "reference"})) as agent:
        trace = await agent.run(capital())
    assert trace.reward is None and trace.rewards["reference"] is None
    assert trace.stop_condition == "scoring_error"        # the run itself finished; scoring failed
    (error,) = trace.errors
    assert (error.type, error.stage) == ("JudgeError", "scoring") and "cannot parse" in error.message
    (call,) = trace.judge_calls
    assert call.reply == "Hard to say." and call.verdict is None and "unparseable" in call.error
    assert trace.judge_usage.total_tokens == 42                      # the tokens were spent all the same


async def test_an_unreachable_judge_endpoint_is_a_scoring_error(openai_server, agent_config):
    port = free_port()   # nothing listens on it
    client = vf.ClientConfig(base_url=f"http://127.0.0.1:{port}/v1", api_key_env="",
                             retries=vf.RetryConfig(max_retries=1, backoff_s=0.01))
    scoring = vf.ScoringConfig(judges=[vf.ReferenceJudgeConfig(model="judge", client=client)])
    openai_server.play([reply("Paris")])
    async with vf.make_agent(agent_config(scoring=scoring)) as agent:
        trace = await agent.run(capital())
    assert trace.reward is None and trace.rewards["reference"] is None
    (error,) = trace.errors
    assert (error.type, error.stage, error.status_code) == ("JudgeError", "scoring", None)   # no response, no status
    assert f"connection refused to 127.0.0.1:{port}" in error.message
    (call,) = trace.judge_calls
    assert (call.status_code, call.retries) == (None, 1) and call.reply is None


async def test_a_judge_endpoint_error_status_is_a_scoring_error(openai_server, judged):
    openai_server.play([reply("Paris"), status(400, body={"error": {"message": "bad model"}})])
    async with vf.make_agent(judged({"id": "reference"})) as agent:
        trace = await agent.run(capital())
    assert trace.reward is None and trace.errors[0].status_code == 400 and trace.judge_calls[0].status_code == 400


RUBRIC = [{"name": "correct", "text": "Is the answer right?", "weight": 3.0},
          {"name": "style", "text": "How concise is it?", "choices": ["rambling", "ok", "concise"]}]


async def test_rubric_scores_each_criterion_as_a_metric_and_the_weighted_mean_as_reward(openai_server, judged):
    verdict = '```json\n{"correct": "YES", "style": " ok "}\n```'
    openai_server.play([reply("Paris"), reply(verdict)])
    async with vf.make_agent(judged({"id": "rubric", "name": "quality", "criteria": RUBRIC})) as agent:
        trace = await agent.run(capital())
    assert trace.metrics == {"quality/correct": 1.0, "quality/style": 0.5}
    assert trace.rewards["quality"] == pytest.approx((3 * 1.0 + 1 * 0.5) / 4)
    assert trace.judge_calls[0].verdict == {"correct": "yes", "style": "ok"}
    prompt = judge_requests(openai_server)[0].messages[0]["content"]
    assert '- style: How concise is it? Options: "rambling", "ok", "concise"' in prompt
    assert "user: What is the capital of France?\nassistant: Paris" in prompt      # full_trace view


@pytest.mark.parametrize("verdict, problem", [
    ('{"correct": "yes"}', "expected exactly"),
    ('{"correct": "yes", "style": "ok", "extra": "no"}', "expected exactly"),
    ('{"correct": "maybe", "style": "ok"}', "not one of"),
    ("correct: yes, style: ok", "no JSON object"),
])
async def test_rubric_verdicts_off_the_menu_are_scoring_errors(openai_server, judged, verdict, problem):
    openai_server.play([reply("Paris"), reply(verdict)])
    async with vf.make_agent(judged({"id": "rubric", "criteria": RUBRIC})) as agent:
        trace = await agent.run(capital())
    assert trace.reward is None and trace.metrics["rubric/correct"] is None
    assert trace.errors[0].type == "JudgeError" and problem in trace.judge_calls[0].error


async def test_rubric_from_a_toml_file_and_judges_declared_by_the_task(openai_server, agent_config, tmp_path):
    (tmp_path / "rubric.toml").write_text('[[criteria]]\nname = "polite"\ntext = "Is it polite?"\n')
    openai_server.play([reply("Paris"), reply('{"polite": "no"}')])
    task_scoring = vf.ScoringConfig.model_validate({"judges": [{
        "id": "rubric", "model": "judge", "rubric": str(tmp_path / "rubric.toml"),
        "client": {"base_url": openai_server.base_url, "api_key_env": ""}}]})
    async with vf.make_agent(agent_config()) as agent:     # no judges set on the agent: the task's apply
        trace = await agent.run(capital(scoring=task_scoring))
    assert trace.rewards == {"mentions_paris": 1.0, "rubric": 0.0} and trace.metrics == {"rubric/polite": 0.0}
    openai_server.play([reply("Paris")])
    async with vf.make_agent(agent_config(scoring=vf.ScoringConfig(judges=[]))) as agent:
        trace = await agent.run(capital(scoring=task_scoring))   # judges = [] set on the agent wins
    assert trace.rewards == {"mentions_paris": 1.0} and trace.judge_calls == []


async def test_skip_rules_skip_judges(openai_server, judged):
    openai_server.play([reply("Par", finish_reason="length")])
    async with vf.make_agent(judged({"id": "reference"}, scoring={"skip_on_truncated": True})) as agent:
        trace = await agent.run(capital())
    assert trace.info["scoring_skipped"] == "truncated" and trace.reward == 0.0 and trace.judge_calls == []


async def test_a_judge_named_like_a_task_reward_is_an_error(openai_server, judged):
    openai_server.play([reply("Paris")])
    async with vf.make_agent(judged({"id": "reference", "name": "mentions_paris"})) as agent:
        trace = await agent.run(capital())
    assert trace.reward is None and "give the judge another name" in trace.errors[0].message


class LengthJudge(vf.Judge):
    """A plugin: asks for a number and scores it against ``options.max``."""

    template = "Rate {response} from 0 to 10."

    async def score(self, task, trace):
        number = await self.ask(trace, self.render(response=trace.last_reply), lambda text: float(text))
        return number / self.config.options["max"]


async def test_a_plugin_judge_by_import_path(openai_server, judged):
    openai_server.play([reply("Paris"), reply("7")])
    async with vf.make_agent(judged({"id": "tests.core.test_judges:LengthJudge", "name": "rating",
                                     "options": {"max": 10}})) as agent:
        trace = await agent.run(capital())
    assert trace.rewards["rating"] == 0.7
    assert judge_requests(openai_server)[0].messages[0]["content"] == "Rate Paris from 0 to 10."


async def test_a_bad_plugin_fails_when_the_agent_opens_before_any_rollout(openai_server, judged):
    with pytest.raises(vf.ConfigError, match="not a subclass"):
        async with vf.make_agent(judged({"id": "tests.core.test_judges:Capital"})):
            pass
    with pytest.raises(vf.ConfigError, match="cannot import it"):
        async with vf.make_agent(judged({"id": "tests.core.no_such_module:Judge"})):
            pass
    assert openai_server.requests == []


class ObjectVerdict(vf.Judge):
    """Parses to an object that is not JSON, then raises from a second parse."""

    async def score(self, task, trace):
        await self.ask(trace, "first", lambda text: object())
        return await self.ask(trace, "second", lambda text: {}["missing"])


async def test_any_parse_failure_is_a_judge_error_and_verdicts_stay_json(openai_server, judged):
    openai_server.play([reply("Paris"), reply("a"), reply("b")])
    async with vf.make_agent(judged({"id": "tests.core.test_judges:ObjectVerdict"})) as agent:
        trace = await agent.run(capital())
    assert trace.errors[0].type == "JudgeError" and "KeyError" not in trace.errors[0].type
    first, second = trace.judge_calls
    assert first.verdict.startswith("<object object") and "unparseable" in second.error
    vf.Trace.model_validate_json(trace.model_dump_json())          # still serialisable


async def test_one_failing_judge_keeps_the_others_grades(openai_server, judged):
    openai_server.default = lambda request: (reply("yes") if "Reference answer" in request.messages[0]["content"]
                                             else reply("no verdict here"))
    openai_server.play([reply("Paris")])
    async with vf.make_agent(judged({"id": "reference"}, {"id": "rubric", "criteria": RUBRIC})) as agent:
        trace = await agent.run(capital())
    assert trace.rewards == {"mentions_paris": 1.0, "reference": 1.0, "rubric": None} and trace.reward is None


async def test_a_judge_without_a_client_uses_the_agents_endpoint(openai_server, agent_config):
    openai_server.play([reply("Paris"), reply("yes")])
    config = agent_config(scoring=vf.ScoringConfig(judges=[vf.ReferenceJudgeConfig(model="judge")]))
    config = vf.AgentConfig.model_validate_json(config.model_dump_json())   # as a deployment's parameters
    async with vf.make_agent(config) as agent:
        trace = await agent.run(capital())
    assert trace.rewards["reference"] == 1.0 and judge_requests(openai_server)[0].path == "/v1/chat/completions"


async def test_a_judge_after_the_agent_closed_is_an_error_not_a_leak():
    from prefect_rollouts.scoring.judges import JudgeClients

    clients = JudgeClients()
    await clients.aclose()
    config = vf.ReferenceJudgeConfig(model="judge")
    with pytest.raises(vf.JudgeError, match="closed"):
        await clients.get(config)


def test_judge_sampling_keeps_temperature_zero_and_cannot_override_the_request():
    from prefect_rollouts.scoring.judges import sampling_body

    config = vf.ReferenceJudgeConfig(model="judge", sampling=vf.SamplingConfig(max_tokens=8, extra={"stop": ["\n"]}))
    assert sampling_body(config) == {"max_tokens": 8, "temperature": 0.0, "stop": ["\n"]}


@pytest.mark.parametrize("reply_text, expected", [
    ("<think>Is it the answer? No, wait.</think>\nyes", "yes"), ("No doubt about it. Verdict: yes", "yes"),
    ("Yes.", "yes"), ("no", "no")])
def test_yes_no_parsing_prefers_explicit_verdicts(reply_text, expected):
    from prefect_rollouts.scoring.judge_plugins import parse_yes_no

    assert parse_yes_no(reply_text) == expected


@pytest.mark.parametrize("reply_text", ["Not yes.", "Yes, but no", "Maybe", ""])
def test_yes_no_parsing_refuses_negated_conflicting_or_missing_verdicts(reply_text):
    from prefect_rollouts.scoring.judge_plugins import parse_yes_no

    with pytest.raises(ValueError):
        parse_yes_no(reply_text)


@pytest.mark.parametrize("answer", [[], "", "  "])
async def test_an_empty_reference_answer_is_a_judge_error(openai_server, judged, answer):
    openai_server.play([reply("Paris")])
    async with vf.make_agent(judged({"id": "reference"})) as agent:
        trace = await agent.run(capital(answer=answer))
    assert trace.reward is None and "no TaskData.answer" in trace.errors[0].message and trace.judge_calls == []


async def test_a_rubric_verdict_naming_a_criterion_twice_is_refused(openai_server, judged):
    openai_server.play([reply("Paris"), reply('{"correct": "no", "correct": "yes", "style": "ok"}')])
    async with vf.make_agent(judged({"id": "rubric", "criteria": RUBRIC})) as agent:
        trace = await agent.run(capital())
    assert trace.reward is None and "twice" in trace.judge_calls[0].error


@pytest.mark.parametrize("criterion, problem", [
    ({"name": "a", "text": "t", "choices": ["yes", "Yes"]}, "distinct"),
    ({"name": " a ", "text": "t"}, "pattern"),
    ({"name": "a", "text": "t", "choices": ["only"]}, "at least 2"),
])
def test_rubric_criteria_are_checked(criterion, problem):
    with pytest.raises(vf.ConfigError, match=problem):
        vf.load_config(f'[env.agent]\nmodel = "m"\n[[env.agent.scoring.judges]]\nid = "rubric"\nmodel = "j"\n'
                       f"criteria = [{_toml_inline(criterion)}]\n")


def _toml_inline(table: dict) -> str:
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + "}"


def test_a_rubric_file_is_relative_to_its_config_read_once_and_dumped_as_criteria(tmp_path, monkeypatch):
    (tmp_path / "rubric.toml").write_text('[[criteria]]\nname = "polite"\ntext = "Is it polite?"\n')
    (tmp_path / "eval.toml").write_text('[env.agent]\nmodel = "m"\n[[env.agent.scoring.judges]]\n'
                                        'id = "rubric"\nmodel = "j"\nrubric = "rubric.toml"\n')
    monkeypatch.chdir("/")
    config = vf.load_config(tmp_path / "eval.toml")
    (tmp_path / "rubric.toml").unlink()                      # later merges and round trips do not re-read it
    from prefect_rollouts.config.agent import effective_scoring

    task_scoring = vf.ScoringConfig(judges=config.scoring.judges)
    merged = effective_scoring(vf.ScoringConfig(), task_scoring)
    again = vf.AgentConfig.model_validate(config.model_dump(mode="json"))
    for scoring in (merged, again.scoring):
        assert [c.name for c in scoring.judges[0].criteria] == ["polite"]
    assert "rubric" not in config.model_dump()["scoring"]["judges"][0]


def test_a_bad_rubric_file_names_the_file_and_the_problem(tmp_path):
    (tmp_path / "rubric.toml").write_text('[[criteria]]\nname = "a"\ntext = "t"\nwieght = 2\n')
    with pytest.raises(ValueError, match=r"rubric.toml': criteria\[0\] is invalid \(wieght: unknown key"):
        vf.ScoringConfig.model_validate(
            {"judges": [{"id": "rubric", "model": "j", "rubric": str(tmp_path / "rubric.toml")}]})


async def test_judge_clients_are_shared_across_rollouts_and_closed_with_the_agent(openai_server, judged):
    openai_server.default = lambda request: reply("yes") if request.body["model"] == "judge" else reply("Paris")
    async with vf.make_agent(judged({"id": "reference"}, {"id": "reference", "name": "again"})) as agent:
        traces = [await agent.run(capital()) for _ in range(3)]
        assert len(agent._services.judges._owned) == 1                 # one client for both judges, all rollouts
    assert agent._services is None
    assert all(t.reward == 2.5 for t in traces) and len(judge_requests(openai_server)) == 6


def test_judge_secrets_are_redacted_from_the_trace_config(judged):
    config = judged({"id": "reference", "client": {"base_url": "https://judge.example/v1",
                                                   "headers": {"X-Key": "secret-123"}}})
    from prefect_rollouts.config.redact import redact_agent_config

    (judge,) = redact_agent_config(config)["scoring"]["judges"]
    assert judge["client"]["headers"] == {"X-Key": "***"}


def test_a_judge_base_url_with_a_password_is_refused(judged):
    with pytest.raises(ValueError, match="holds a user name or password"):
        judged({"id": "reference", "client": {"base_url": "https://u:p@judge.example/v1"}})


@pytest.mark.parametrize("entry, message", [
    ('id = "rubrik"\nmodel = "j"\nrubric = "r.toml"', "judges[0]: id = 'rubrik': use \"reference\""),
    ('id = "referense"\nmodel = "j"\ncriteria = []', "id = 'referense'"),
    ('id = "reference"\nmodel = "j"\nrubric = "r.toml"', "[env.agent.scoring.judges[0]] rubric: unknown key"),
])
def test_judge_config_errors_name_the_real_mistake(entry, message):
    with pytest.raises(vf.ConfigError) as raised:
        vf.load_config(f'[env.agent]\nmodel = "m"\n[[env.agent.scoring.judges]]\n{entry}\n')
    assert message in str(raised.value)
