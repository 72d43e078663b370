"""Where an eval's config travels: every call that is handed the ``EvalConfig``, by module and layer.

Runs one small eval from the command line (``prefect-rollouts eval``, in this process: 4 tasks of the arithmetic taskset, ``task`` granularity, the
scripted OpenAI server on loopback, Prefect's in-process test server) under ``sys.setprofile`` and
records each function called with an ``EvalConfig`` among its parameters (a config's own methods
count: their ``self``). Prints the modules visited and how often, and the *climbs back*: calls from a
module of a lower layer into one of a higher layer (layers, top down: the CLI, the Prefect layer
``flows``/``tasks``/``blocks``, the eval package, the rest of the core). The issue that split the eval
out of ``flows/`` counted the walk as rooms (modules) and visits; this prints both.

Usage: ``.venv/bin/python benchmarks/config_walk.py`` from the checkout (any version of the tree:
the old ``plan``, ``run_identity`` and ``prepare`` modules count as the eval layer).
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests.fakes: the scripted server

EVAL_MODULES = ("plan", "run_identity", "prepare")   # before the eval package existed


def layer(module: str) -> int:
    """3 the CLI, 2 the Prefect layer, 1 the eval package, 0 the rest of the core."""
    leaf = module.removeprefix("prefect_rollouts.")
    if leaf.split(".")[0] == "cli" or leaf.startswith("cli_"):   # cli/ (cli.py, cli_*.py before it)
        return 3
    if leaf.split(".")[0] in ("flows", "tasks", "blocks"):
        return 2
    if leaf.split(".")[0] == "evals" or leaf in EVAL_MODULES:
        return 1
    return 0


def main() -> None:
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness
    from tests.fakes.openai_server import ScriptedOpenAIServer, reply
    from typer.testing import CliRunner

    from prefect_rollouts.cli import app
    from prefect_rollouts.config.eval import EvalConfig

    visits: collections.Counter[str] = collections.Counter()
    climbs: collections.Counter[str] = collections.Counter()
    seen: set[FrameType] = set()   # a coroutine's frame is "called" again at every resumption: count it once

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame in seen:
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("prefect_rollouts"):
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if not any(isinstance(frame.f_locals.get(name), EvalConfig) for name in names):
            return
        seen.add(frame)
        visits[module] += 1
        caller = frame.f_back
        while caller is not None and not caller.f_globals.get("__name__", "").startswith("prefect_rollouts"):
            caller = caller.f_back   # through Prefect's and asyncio's frames to the project's caller
        if caller is not None and layer(caller.f_globals["__name__"]) < layer(module):
            climbs[f"{caller.f_globals['__name__']}.{caller.f_code.co_name} -> {module}.{code.co_name}"] += 1

    with tempfile.TemporaryDirectory() as tmp, ScriptedOpenAIServer() as server, \
            prefect_test_harness(server_startup_timeout=120):
        server.default = reply("4")
        toml = Path(tmp) / "eval.toml"
        toml.write_text(f'rollout_granularity = "task"\nnum_tasks = 4\n[traces]\npath = "{tmp}/traces"\n'
                        '[env.taskset]\nid = "arithmetic"\n[env.agent]\nmodel = "scripted"\nharness = "chat"\n'
                        f'[env.agent.client]\nbase_url = "{server.base_url}"\napi_key_env = ""\n')
        os.environ["PREFECT_API_URL"] = str(PREFECT_API_URL.value())   # the CLI uses it, no temporary server
        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            result = CliRunner().invoke(app, ["eval", str(toml)])
        finally:
            sys.setprofile(None)
            threading.setprofile(None)   # type: ignore[arg-type]
    assert result.exit_code == 0, result.output
    print(f"modules visited: {len(visits)}, visits: {sum(visits.values())}, "
          f"climbs back: {sum(climbs.values())} ({len(climbs)} distinct calls)")
    for module, count in sorted(visits.items(), key=lambda item: (-layer(item[0]), item[0])):
        print(f"  layer {layer(module)}  {module}: {count}")
    for call, count in sorted(climbs.items()):
        print(f"  climb: {call} x{count}")


if __name__ == "__main__":
    main()
