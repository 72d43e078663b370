"""The ``prefect-rollouts`` command: its subcommands, the terminal console, the temporary Prefect server.

``main.py`` holds the Typer ``app`` (``eval``, ``serve``, ``server``, ...) and the ``tasks``, ``traces``
and ``alerts`` groups come from ``tasks.py`` and ``traces.py``; ``console.py`` prints progress, summaries
and errors; ``server.py`` finds or starts the Prefect server a command talks to; ``retry.py`` parses
``--retry-errors``; ``stop_signals.py`` makes SIGTERM end a command as Ctrl-C does. The top of the
stack: may import Prefect, ``flows/`` and the core; nothing imports it.
"""

from prefect_rollouts.cli.main import app

__all__ = ["app"]
