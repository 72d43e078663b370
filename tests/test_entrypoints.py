"""The paths Prefect stores in a deployment still load: a deployment made before the package was regrouped
(``deployments/prefect.yaml``'s entrypoints, the shard deployment's module path) keeps running after it.

Prefect keeps a deployment's ``entrypoint`` as text (``flows/launch.py:launch_flow``, or a module path such as
``prefect_rollouts.flows.shard:shard_flow``) and a worker loads it at every flow run, so a flow module that
moves breaks every deployment made before the move, silently until its next scheduled run. The flow modules
stay in ``flows/`` (``docs/architecture.md``); these tests fail if one moves or its flow is renamed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

REPOSITORY = Path(__file__).resolve().parents[1]


def stored_entrypoints() -> list[str]:
    """Every entrypoint a deployment of this project stores: those in ``deployments/prefect.yaml`` and the
    shard deployment's (``flows/shard.py``: ``ENTRYPOINT``, what ``dispatch`` registers on a work pool)."""
    from prefect_rollouts.flows.shard import ENTRYPOINT

    spec = yaml.safe_load((REPOSITORY / "deployments" / "prefect.yaml").read_text())
    return [d["entrypoint"] for d in spec["deployments"]] + [ENTRYPOINT]


def test_the_entrypoints_are_the_ones_deployments_were_made_with():
    """The list itself: a new deployment adds its entrypoint here, and a changed one is a re-deploy for
    every user, which this test makes a decision rather than an accident."""
    assert stored_entrypoints() == ["flows/launch.py:launch_flow", "flows/janitor.py:janitor_flow",
                                    "prefect_rollouts.flows.shard:shard_flow"]


@pytest.mark.parametrize("entrypoint", ["flows/launch.py:launch_flow", "flows/janitor.py:janitor_flow",
                                        "prefect_rollouts.flows.shard:shard_flow"])
def test_a_stored_entrypoint_loads_its_flow(entrypoint: str, monkeypatch: pytest.MonkeyPatch):
    """As a worker loads it: a file path from the repository root (the pull step's working directory), or
    a module path from the installed package."""
    from prefect import Flow
    from prefect.flows import load_flow_from_entrypoint

    monkeypatch.chdir(REPOSITORY)
    loaded = load_flow_from_entrypoint(entrypoint)
    assert isinstance(loaded, Flow)
    assert loaded.fn.__name__ == entrypoint.rpartition(":")[2]
