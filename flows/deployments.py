"""The deployments of this project, served from one process (``prefect-rollouts serve``).

``deployments/prefect.yaml`` declares the same deployments for ``prefect deploy`` onto a work
pool; this module is the no-work-pool way (``flow.serve``) for a single machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from prefect import serve
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.evals.launch_form import LaunchForm
from prefect_rollouts.flows.launch import launch_flow

NIGHTLY = "nightly-eval"
JANITOR = "sandbox-janitor"


def build_deployments(config: str | Path, *, cron: str = "0 2 * * *", timezone: str = "UTC") -> list[RunnerDeployment]:
    """The ``launch`` flow as ``nightly-eval`` (on ``cron`` in ``timezone``; its UI form's defaults
    are the config's values, ``LaunchForm.from_eval_config``) and the ``janitor`` flow as
    ``sandbox-janitor`` (hourly).

    Raises:
        ConfigError: the config does not load, or holds secret header values (a form cannot carry them).
    """
    from prefect_rollouts.flows.janitor import janitor_flow

    eval_config = load_eval_config(config)
    form = LaunchForm.from_eval_config(eval_config)
    nightly = launch_flow.to_deployment(
        name=NIGHTLY, schedule=Cron(cron, timezone=timezone), parameters={"eval": form.model_dump(mode="json")},
        description=f"Nightly eval of {eval_config.env.agent.model} on "
                    f"{', '.join(env.name for env in eval_config.environments())} "
                    f"(config {config}); Run > Custom run launches any eval from a form.",
        tags=["prefect-rollouts", "eval"])
    janitor = janitor_flow.to_deployment(name=JANITOR, interval=3600, tags=["prefect-rollouts", "janitor"],
                                         description="Removes sandboxes left by killed rollouts and marks their "
                                                     "flow runs Crashed.")
    return [cast(RunnerDeployment, nightly), cast(RunnerDeployment, janitor)]


def serve_deployments(config: str | Path, *, cron: str = "0 2 * * *", timezone: str = "UTC") -> None:
    """Serve ``build_deployments(config, cron=cron, timezone=timezone)`` from this process until interrupted.

    Raises:
        ConfigError: the config does not load, or holds secret header values.
    """
    serve(*build_deployments(config, cron=cron, timezone=timezone))
