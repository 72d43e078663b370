"""Judge configs: the ``[[env.agent.scoring.judges]]`` entries, one model per plugin kind.

``id`` selects the model: ``"reference"`` and ``"rubric"`` are the built-in plugins, anything
else must be an import path ``"pkg.module:Class"`` of a ``Judge`` subclass. A rubric file is read
once, at validation, into ``criteria``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationError, ValidationInfo, model_validator

from prefect_rollouts.config.base import JUDGE_TAGS, ClientConfig, ConfigModel, SamplingConfig, explain_error
from prefect_rollouts.nesting import loads, toml_loads


class JudgeConfig(ConfigModel):
    """A judge: a model of its own that grades the finished trace; one ``[[...scoring.judges]]`` entry.

    ``id`` picks the plugin: ``"reference"`` (``ReferenceJudgeConfig``), ``"rubric"``
    (``RubricJudgeConfig``) or ``"pkg.module:Class"`` (``PluginJudgeConfig``). The judge's score
    is recorded as the reward ``name`` (default: ``id``) with ``weight``.
    """

    id: str
    """``"reference"``, ``"rubric"``, or the import path ``"pkg.module:Class"`` of a ``Judge`` subclass."""
    name: str | None = None
    """Reward key of the judge's score; default ``id``. Must not clash with another reward."""
    weight: float = Field(1.0, ge=0)
    """Weight of the judge's reward in ``trace.reward`` (the weighted sum of the rewards)."""
    model: str = Field(min_length=1)
    """The judge's model (``local/smollm2`` and ``local/PATH.gguf`` start a local server)."""
    client: ClientConfig | None = None
    """The judge's own endpoint (``base_url``/``api_key_env`` or a ``ModelEndpoint`` block in
    ``endpoint``), independent of the agent's; None: the agent's endpoint."""
    sampling: SamplingConfig = SamplingConfig(temperature=0.0)
    """The judge's sampling (``[env.agent.sampling]``'s keys); temperature 0 by default."""
    prompt: str | None = None
    """Prompt template replacing the plugin's; ``{field}`` placeholders as the plugin documents."""

    @property
    def reward_name(self) -> str:
        """The reward key: ``name`` or else ``id``."""
        return self.name or self.id


class ReferenceJudgeConfig(JudgeConfig):
    """``id = "reference"``: asks whether the reply matches ``TaskData.answer`` (yes = 1, no = 0).

    A list answer means any of its items is acceptable. An empty reply scores 0 without a call.
    Template fields: ``{question}``, ``{answer}``, ``{response}``.
    """

    id: Literal["reference"] = "reference"
    view: Literal["last_reply", "full_trace"] = "last_reply"
    """What the judge sees as the response: the last assistant reply or the whole transcript."""


class RubricCriterion(ConfigModel):
    """One rubric criterion; ``choices`` run from worst to best and score evenly from 0 to 1."""

    name: str = Field(min_length=1, pattern=r"^\S(.*\S)?$")
    """The criterion's key in the verdict (no leading or trailing space)."""
    text: str = Field(min_length=1)
    """The question the judge answers for this criterion."""
    weight: float = Field(1.0, gt=0)
    """Weight of the criterion in the rubric's weighted mean."""
    choices: list[str] = Field(["no", "yes"], min_length=2)
    """The answers the judge may give, worst first; they score evenly from 0 to 1."""

    @model_validator(mode="after")
    def _distinct_choices(self) -> RubricCriterion:
        folded = [choice.strip().lower() for choice in self.choices]
        if len(set(folded)) != len(folded) or "" in folded:
            raise ValueError(f"choices = {self.choices}: need distinct, non-empty options (case is ignored)")
        return self


class RubricJudgeConfig(JudgeConfig):
    """``id = "rubric"``: grades each criterion in one call; each is a metric ``<name>/<criterion>``
    and the reward is their weighted mean.

    Criteria come inline (``criteria``) or from a TOML/JSON file with a ``criteria`` list
    (``rubric``). Template fields: ``{question}``, ``{response}``, ``{criteria}``.
    """

    id: Literal["rubric"] = "rubric"
    view: Literal["last_reply", "full_trace"] = "full_trace"
    """What the judge sees as the response: the whole transcript, or the last assistant reply."""
    criteria: list[RubricCriterion] = []
    """The criteria (``RubricCriterion``), inline; or read from ``rubric``."""
    rubric: Path | None = Field(None, exclude=True)
    """A TOML or JSON file holding ``criteria = [{name, text, weight, choices}, ...]``; a relative
    path is relative to the config file. Read once, into ``criteria`` (which is what a dump keeps)."""

    @model_validator(mode="before")
    @classmethod
    def _criteria_or_rubric(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("criteria") and value.get("rubric"):
            raise ValueError("set criteria or rubric, not both")
        return value

    @model_validator(mode="after")
    def _load_rubric(self, info: ValidationInfo) -> RubricJudgeConfig:
        if self.rubric is not None and not self.criteria:  # once: later copies carry the criteria
            base = (info.context or {}).get("config_dir")
            if base is not None and not self.rubric.is_absolute():
                self.rubric = Path(base) / self.rubric
            self.criteria = _read_rubric(self.rubric)
        if not self.criteria:
            raise ValueError("a rubric judge needs criteria: add criteria = [{name, text}] or rubric = \"file.toml\"")
        names = [c.name for c in self.criteria]
        if len(set(names)) != len(names):
            raise ValueError(f"criterion names must be unique, got {names}")
        return self


class PluginJudgeConfig(JudgeConfig):
    """``id = "pkg.module:Class"``: a ``Judge`` subclass of your own; ``options`` go to it as they are."""

    options: dict[str, Any] = {}
    """Anything the plugin takes, passed as it is (``self.config.options``)."""

    @model_validator(mode="before")
    @classmethod
    def _import_path(cls, value: Any) -> Any:
        judge_id = value.get("id") if isinstance(value, dict) else getattr(value, "id", None)
        module, _, attribute = str(judge_id).partition(":")
        # checked first: the other keys may belong to the intended id
        if isinstance(judge_id, str) and (not module or not attribute):
            raise ValueError(f'id = {judge_id!r}: use "reference", "rubric" or an import path "pkg.module:Class"')
        return value


def _judge_kind(value: Any) -> str:
    judge_id = value.get("id") if isinstance(value, dict) else getattr(value, "id", None)
    return judge_id if judge_id in JUDGE_TAGS[:2] else "plugin"


AnyJudgeConfig = Annotated[
    Annotated[ReferenceJudgeConfig, Tag("reference")] | Annotated[RubricJudgeConfig, Tag("rubric")]
    | Annotated[PluginJudgeConfig, Tag("plugin")],
    Discriminator(_judge_kind)]


def _read_rubric(path: Path) -> list[RubricCriterion]:
    try:
        text = path.read_text(encoding="utf-8")
        data = loads(text, "the file") if path.suffix == ".json" else toml_loads(text, "the file")
    except (OSError, ValueError) as exc:
        raise ValueError(f"rubric = {str(path)!r}: cannot read it ({exc}). Give a TOML or JSON file") from exc
    if not isinstance(data, dict) or not isinstance(data.get("criteria"), list):
        raise ValueError(f"rubric = {str(path)!r}: needs a top-level criteria list")
    criteria = []
    for index, criterion in enumerate(data["criteria"]):
        try:
            criteria.append(RubricCriterion.model_validate(criterion))
        except ValidationError as exc:
            problems = "; ".join(explain_error(err, "") for err in exc.errors())
            raise ValueError(f"rubric = {str(path)!r}: criteria[{index}] is invalid ({problems})") from None
    return criteria
