"""prefect-rollouts: run and score LLM-agent rollouts; each rollout can be a Prefect flow."""

from prefect_rollouts.agent import Agent, Interaction, make_agent
from prefect_rollouts.config.agent import (
    AgentConfig,
    ClientConfig,
    HarnessConfig,
    NetworkPolicy,
    RetryConfig,
    RuntimeConfig,
    SamplingConfig,
    ScoringConfig,
    StageRetryConfig,
    TimeoutConfig,
    load_config,
)
from prefect_rollouts.config.judge import JudgeConfig, ReferenceJudgeConfig, RubricCriterion, RubricJudgeConfig
from prefect_rollouts.errors import (
    ConfigError,
    InfrastructureError,
    JudgeError,
    ProviderError,
    RolloutsError,
    RuntimeUnavailableError,
    ScoringEnvError,
    StageTimeoutError,
    TaskError,
)
from prefect_rollouts.rollout_state import Segment
from prefect_rollouts.runtimes import ExecResult
from prefect_rollouts.scoring.judges import Judge
from prefect_rollouts.task import Task, TaskData, metric, reward
from prefect_rollouts.trace import Receipt, Trace

__all__ = [
    "Agent",
    "AgentConfig",
    "ClientConfig",
    "ConfigError",
    "ExecResult",
    "HarnessConfig",
    "InfrastructureError",
    "Interaction",
    "Judge",
    "JudgeConfig",
    "JudgeError",
    "NetworkPolicy",
    "ProviderError",
    "Receipt",
    "ReferenceJudgeConfig",
    "RetryConfig",
    "RolloutsError",
    "RubricCriterion",
    "RubricJudgeConfig",
    "RuntimeConfig",
    "RuntimeUnavailableError",
    "SamplingConfig",
    "ScoringConfig",
    "ScoringEnvError",
    "Segment",
    "StageRetryConfig",
    "StageTimeoutError",
    "Task",
    "TaskData",
    "TaskError",
    "TimeoutConfig",
    "Trace",
    "load_config",
    "make_agent",
    "metric",
    "reward",
]
