"""The Prefect servers this project starts batch the task-run recorder (pgserver.SERVER_SETTINGS)."""

from __future__ import annotations

import pytest

from prefect_rollouts.servers.postgres import SERVER_SETTINGS, server_env

pytestmark = pytest.mark.unit


def test_server_settings_are_added_and_the_users_own_win():
    env = server_env({"PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "7", "OTHER": "x"})
    assert env["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"] == "7"
    assert env["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL"] == "1" and env["OTHER"] == "x"
    assert set(SERVER_SETTINGS) <= set(env)


def test_prefect_knows_every_server_setting():
    from prefect.settings import Settings

    settings = Settings.model_validate({})   # the names are Prefect's own: a typo would be ignored silently
    recorder = settings.server.services.task_run_recorder
    names = {f"PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_{field.upper()}" for field in type(recorder).model_fields}
    assert set(SERVER_SETTINGS) <= names
