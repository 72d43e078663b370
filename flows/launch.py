"""``launch_flow``: the eval as the Prefect UI launches it, from one ``LaunchForm`` parameter.

The deployment page's "Custom run" form is rendered from this flow's parameter schema, so the
parameter is the people-shaped ``LaunchForm`` (``evals/launch_form.py``), not the 86-field
``EvalConfig``. The flow turns it into an ``EvalConfig`` and runs ``eval_flow`` on it as a
subflow (through ``run_eval``, as the CLI does): the eval then runs exactly as from the CLI or a
notebook (same planning, states, artifacts, run naming by run id), and that flow run's
parameters show the whole config that ran.
The launch flow run keeps the name Prefect's form gives it ("Run Name").
"""

from __future__ import annotations

from prefect import State, flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.states import Failed

from prefect_rollouts.errors import EvalFailedError
from prefect_rollouts.evals.baseline import LAST
from prefect_rollouts.evals.launch_form import LaunchForm
from prefect_rollouts.evals.prepare import new_run_id
from prefect_rollouts.flows.eval import run_eval
from prefect_rollouts.traces import EvalSummary


@flow(name="launch", persist_result=False, log_prints=False)
async def launch_flow(eval: LaunchForm) -> EvalSummary | State[EvalSummary]:
    """Run an eval from the launch form: taskset and its options, model, endpoint, size, concurrency.

    Args:
        eval: The eval to run: common settings first, the rarer ones and any other config key under Advanced
            (Advanced > Finish run continues an earlier run instead, its errored rollouts too).

    Returns:
        The ``EvalSummary`` of the eval flow run (a subflow of this one, named after its run
        id); when that run failed, a Failed state with its message (e.g. ``6 of 6 rollouts
        errored (ProviderError: ...)``), as ``eval_flow`` itself returns.

    Raises:
        ConfigError: the form does not make a valid eval config (the message names the field).
    """
    config = eval.to_eval_config()
    if config.baseline == LAST and await _custom_run(eval):
        get_run_logger().info('a custom run of this deployment: no comparison with its baseline (the deployment\'s '
                              'own runs keep it); set Advanced > Baseline to a run id to compare with that run')
        config = config.model_copy(update={"baseline": None})
    finish = eval.advanced.finish_run
    run_id = finish or new_run_id(config)
    environments = ", ".join(env.name for env in config.environments())
    get_run_logger().info("run %s: %s on %s, traces in %s", run_id, config.env.agent.model, environments,
                          config.traces.store or config.traces.path)
    if finish:   # an earlier run with its errored rollouts: --resume RUN_ID --retry-errors (docs/retries.md)
        summary, failure = await run_eval(config, resume=run_id, retry_errors=True,
                                          retry_error_types=config.retry_error_types)
    else:
        summary, failure = await run_eval(config, run_id=run_id)
    return summary if failure is None else Failed(message=failure, data=EvalFailedError(failure, summary))


async def _custom_run(form: LaunchForm) -> bool:
    """Whether this launch is a deployment's run with other values than its defaults (a "Custom run"
    from the UI): such a run must not join the deployment's baseline series, where it would raise a
    false alert and become the next night's baseline."""
    context = FlowRunContext.get()
    deployment_id = context.flow_run.deployment_id if context and context.flow_run else None
    if deployment_id is None:
        return False
    async with get_client() as client:
        defaults = (await client.read_deployment(deployment_id)).parameters.get("eval")
    return defaults is None or LaunchForm.model_validate(defaults) != form
