"""Run mini-swe-agent (github.com/SWE-agent/mini-swe-agent) once, non-interactively, on the turn's prompt.

    python3 mini_swe_agent.py SITE [tool_calls|text]

Run in the runtime by the ``mini-swe-agent`` program harness (``harnesses/mini_swe_agent.py``),
with mini-swe-agent and its dependencies importable from ``SITE`` (a ``pip install --target``
directory: baked into the image by ``sandbox build --with mini-swe-agent``, or prepared on the host
and mounted read-only). It builds what mini-swe-agent's ``mini`` command builds, minus the prompts
to a person: the ``DefaultAgent`` with the package's own ``mini.yaml`` (tool calls) or
``mini_textbased.yaml`` (a ```mswea_bash_command block in the reply) templates, its
``LocalEnvironment`` in the working directory, and its litellm model pointed at the interception
endpoint (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_MODEL``). The task is ``PROMPT_FILE``
(with ``SYSTEM_PROMPT_FILE`` ahead of it when set).

mini-swe-agent's own limits are off (step and cost limits: the endpoint enforces ``max_turns``)
and so are its retries (the endpoint retries upstream; a refused request must end the run at
once, not after minutes of backoff: ``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1``, the OpenAI
client's ``max_retries=0``).

Output: stdout is the submission (the output of the agent's final command after
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``); the last stderr line is ``[mini-swe-agent]
{"exit_status": ..., "model_calls": N, "site": SITE}``; everything mini-swe-agent and litellm print goes to
stderr. Exit 0 when the agent ran to an end of its own (Submitted, LimitsExceeded,
RepeatedFormatError: the task's rewards judge the result), 1 when it raised (a model request
refused or failed, a crash), 2 on bad usage.
"""

import contextlib
import json
import os
import sys

MARKER = "[mini-swe-agent] "
CONFIGS = {"tool_calls": ("mini.yaml", "litellm"), "text": ("mini_textbased.yaml", "litellm_textbased")}


def main(argv):
    if len(argv) not in (2, 3) or (argv[2:] and argv[2] not in CONFIGS):
        sys.stderr.write("usage: mini_swe_agent.py SITE [tool_calls|text]\n")
        return 2
    site, mode = argv[1], (argv[2] if argv[2:] else "tool_calls")
    if not os.path.isdir(os.path.join(site, "minisweagent")):
        sys.stderr.write(f"mini_swe_agent.py: no mini-swe-agent in {site}\n")
        return 2
    sys.path.insert(0, site)
    # before mini-swe-agent and litellm are imported: they read these at import
    os.environ.update(MSWEA_SILENT_STARTUP="1", MSWEA_COST_TRACKING="ignore_errors",
                      MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT="1", LITELLM_LOCAL_MODEL_COST_MAP="True",
                      MSWEA_GLOBAL_CONFIG_DIR=os.path.join(os.environ.get("TMPDIR", "/tmp"), "mini-swe-agent"))
    task = read(os.environ["PROMPT_FILE"])
    if os.environ.get("SYSTEM_PROMPT_FILE") and os.path.exists(os.environ["SYSTEM_PROMPT_FILE"]):
        task = read(os.environ["SYSTEM_PROMPT_FILE"]) + "\n\n" + task
    result, agent = {"exit_status": "NotStarted", "submission": ""}, None
    with contextlib.redirect_stdout(sys.stderr):
        try:
            agent = build(mode)
            result = agent.run(task)
        except BaseException as exc:  # reported on the marker line, then the exit code says it failed
            result = {"exit_status": type(exc).__name__, "submission": "", "error": str(exc)[-2000:]}
    sys.stdout.write(result.get("submission") or "")
    report = {"exit_status": result.get("exit_status", ""), "model_calls": agent.n_calls if agent else 0,
              "site": site}
    if "error" in result:
        report["error"] = result["error"]
    sys.stderr.write("\n" + MARKER + json.dumps(report) + "\n")
    return 1 if "error" in result else 0


def build(mode):
    """mini-swe-agent's DefaultAgent with its built-in config for ``mode`` and the endpoint as its model."""
    import litellm
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import builtin_config_dir
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models import get_model

    litellm.suppress_debug_info = True   # its "Provider List: ..." banner would fill the stderr tail
    config_file, model_class = CONFIGS[mode]
    with open(os.path.join(builtin_config_dir, config_file), encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    model_config = dict(config.get("model") or {})
    model_config.update(model_class=model_class, model_name="openai/" + os.environ["OPENAI_MODEL"],
                        cost_tracking="ignore_errors",
                        model_kwargs={**(model_config.get("model_kwargs") or {}), "drop_params": True,
                                      "api_base": os.environ["OPENAI_BASE_URL"],
                                      "api_key": os.environ["OPENAI_API_KEY"], "max_retries": 0})
    model = get_model(config=model_config)
    environment = LocalEnvironment(**{**(config.get("environment") or {}), "cwd": os.getcwd()})
    # the interactive agent's keys (mode, confirm_exit, ...) are ignored by DefaultAgent's config
    return DefaultAgent(model, environment, **{**(config.get("agent") or {}), "step_limit": 0, "cost_limit": 0})


def read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
