"""``python -m prefect_rollouts.cli ...``: the ``prefect-rollouts`` command, with this interpreter."""

from prefect_rollouts.cli.main import app

app()
