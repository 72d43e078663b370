"""The built-in judges: ``reference`` (matches ``TaskData.answer``?) and ``rubric`` (criteria grades)."""

from __future__ import annotations

import json
import re
from typing import Any

from prefect_rollouts.config.judge import ReferenceJudgeConfig, RubricJudgeConfig
from prefect_rollouts.errors import JudgeError, scrub
from prefect_rollouts.scoring.judge_base import TOOL_OUTPUT_CAP_CHARS, Judge, cap_text
from prefect_rollouts.task import Task
from prefect_rollouts.trace import Trace, content_text


class ReferenceJudge(Judge):
    """Asks whether the response gives the reference answer: ``yes`` scores 1.0, ``no`` 0.0.

    ``TaskData.answer`` is the reference; a list means any item is acceptable. An empty
    response scores 0 without a call. The reply is parsed leniently: a leading yes/no, a
    ``verdict: yes`` line, or the only one of the two words in it.
    """

    config: ReferenceJudgeConfig
    template = (
        "You are grading whether a response gives the same answer as a reference answer.\n\n"
        "Question:\n{question}\n\nReference answer:\n{answer}\n\nResponse:\n{response}\n\n"
        "Does the response give the reference answer? Wording, formatting and extra explanation do not "
        "matter; a different, incomplete or missing answer does. Reply with one word: yes or no.")

    async def score(self, task: Task, trace: Trace) -> float:
        """1.0 when the judge says ``yes``, 0.0 for ``no`` or an empty response.

        Raises:
            JudgeError: the task has no answer, the call failed or the reply has no verdict.
        """
        answer = task.data.answer
        items = answer if isinstance(answer, (list, tuple)) else [answer]
        if not any(item is not None and _answer_item(item).strip() for item in items):
            raise JudgeError(f"judge {self.name!r}: task {task.id!r} has no TaskData.answer to compare with "
                             f"(got {cap_text(repr(answer), 120)})")
        response = view(trace, self.config.view)
        if not response.strip():
            return 0.0
        prompt = self.render(question=question_text(task), answer=answer_text(task.data.answer), response=response)
        return 1.0 if await self.ask(trace, prompt, parse_yes_no) == "yes" else 0.0


class RubricJudge(Judge):
    """Grades every criterion in one call; each criterion is a metric ``<name>/<criterion>`` with
    score index / (choices - 1), and the reward is their weighted mean.

    The reply must be a JSON object naming every criterion exactly once with one of its
    choices (case and surrounding space are ignored); anything else is a ``JudgeError``.
    """

    config: RubricJudgeConfig
    template = (
        "You are grading a response against a rubric.\n\nTask:\n{question}\n\nResponse:\n{response}\n\n"
        "Criteria:\n{criteria}\n\nFor each criterion choose exactly one of its options. Reply with only a "
        "JSON object that maps each criterion name to the chosen option, like:\n{example}")

    async def score(self, task: Task, trace: Trace) -> float:
        """The weighted mean of the criteria scores, in [0, 1].

        Raises:
            JudgeError: the call failed or the reply is not a complete on-menu verdict.
        """
        criteria = self.config.criteria
        for criterion in criteria:
            trace.metrics[f"{self.name}/{criterion.name}"] = None
        listing = "\n".join(f"- {c.name}: {c.text} Options: {', '.join(json.dumps(x) for x in c.choices)}"
                            for c in criteria)
        example = json.dumps({c.name: f"<one of: {', '.join(c.choices)}>" for c in criteria})
        prompt = self.render(question=question_text(task), response=view(trace, self.config.view),
                             criteria=listing, example=example)
        verdict = await self.ask(trace, prompt, self.parse)
        total = weight = 0.0
        for criterion in criteria:
            value = criterion.choices.index(verdict[criterion.name]) / (len(criterion.choices) - 1)
            trace.metrics[f"{self.name}/{criterion.name}"] = value
            total, weight = total + criterion.weight * value, weight + criterion.weight
        return total / weight

    def parse(self, reply: str) -> dict[str, str]:
        """``{criterion: choice}`` from the reply's JSON object.

        Raises:
            ValueError: no JSON object, missing or unknown criteria, or an off-menu choice.
        """
        found = _json_object(reply)
        given = {str(key).strip(): value for key, value in found.items()}
        names = [c.name for c in self.config.criteria]
        if set(given) != set(names):
            raise ValueError(f"verdict names {cap_text(repr(sorted(given)), 200)}, expected exactly {sorted(names)}")
        verdict = {}
        for criterion in self.config.criteria:
            choice = given[criterion.name]
            menu = {c.lower(): c for c in criterion.choices}
            if not isinstance(choice, str) or choice.strip().lower() not in menu:
                raise ValueError(f"{criterion.name} = {cap_text(repr(choice), 80)} is not one of {criterion.choices}")
            verdict[criterion.name] = menu[choice.strip().lower()]
        return verdict


BUILTIN_JUDGES: dict[str, type[Judge]] = {"reference": ReferenceJudge, "rubric": RubricJudge}


def parse_yes_no(reply: str) -> str:
    """``"yes"`` or ``"no"`` from a judge reply.

    ``<think>...</think>`` reasoning is dropped first. Then a ``verdict:`` (or ``answer:``,
    ``grade:``) marker wins, the last one counting; without one, the first and the last word
    must agree on yes or no (one of them may be another word). A negated ``not yes`` is no verdict.

    Raises:
        ValueError: no verdict, conflicting ones, or a negated one.
    """
    text = re.sub(r"<think>.*?(</think>|$)", " ", reply, flags=re.DOTALL | re.IGNORECASE).lower()
    if re.search(r"\bnot\s+(yes|no)\b", text):
        raise ValueError(f"a negated verdict in {cap_text(reply)!r}")
    marked = re.findall(r"\b(?:verdict|answer|grade)\W*(yes|no)\b", text)
    if marked:
        return marked[-1]
    words = re.findall(r"[a-z]+", text)
    ends = {word for word in words[:1] + words[-1:] if word in ("yes", "no")}
    if len(ends) == 1:
        return ends.pop()
    raise ValueError(f"expected yes or no, got {cap_text(reply)!r}")


def question_text(task: Task) -> str:
    """The task's opening user message(s) as text (the system prompt is left out)."""
    prompt = task.data.prompt
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(content_text(m.get("content")) for m in prompt or [] if m.get("role") == "user")


def answer_text(answer: Any) -> str:
    """The reference answer as text; a list becomes "Any of:" and one item per line."""
    if isinstance(answer, (list, tuple)):
        return "Any of:\n" + "\n".join(f"- {_answer_item(item)}" for item in answer)
    return _answer_item(answer)


def _answer_item(item: Any) -> str:
    return item if isinstance(item, str) else json.dumps(item)


def view(trace: Trace, kind: str) -> str:
    """What a judge reads: the last assistant reply, or the transcript after the system prompt
    (roles, texts, tool calls, and tool results scrubbed of secrets, then cut to ``TOOL_OUTPUT_CAP_CHARS``)."""
    if kind == "last_reply":
        return trace.last_reply
    lines = []
    for message in trace.messages:
        role = message.get("role")
        if role == "system":
            continue
        text = content_text(message.get("content"))
        if role == "tool":   # scrubbed before the cut, which could otherwise halve a key (the prompt is recorded)
            text = scrub(text)
            text = text if len(text) <= TOOL_OUTPUT_CAP_CHARS else text[:TOOL_OUTPUT_CAP_CHARS] + " [...]"
        if text:
            lines.append(f"{role}: {text}")
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            lines.append(f"{role} calls {function.get('name')}({function.get('arguments') or ''})")
    return "\n".join(lines)


def _json_object(reply: str) -> dict[str, Any]:
    start, end = reply.find("{"), reply.rfind("}")
    if start < 0 or end < start:
        raise ValueError(f"no JSON object in {cap_text(reply)!r}")
    try:
        found = json.loads(reply[start:end + 1], object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("the JSON object is nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({cap_text(str(exc))}) in {cap_text(reply)!r}") from None
    if not isinstance(found, dict):
        raise ValueError(f"expected a JSON object, got {cap_text(reply)!r}")
    return found


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the verdict names {cap_text(key, 80)!r} twice")
        found[key] = value
    return found
