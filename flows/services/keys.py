"""Names of what an eval keeps on the Prefect server per series or run: artifact keys, Variable names.

One sanitiser (``prefect_key``, with ``prefect_rollouts.keys.slug``, which also makes a run id's
default prefix) makes them all. Prefect's artifact keys allow lowercase ASCII
letters, digits and dashes (Variable names too, and underscores); a name that already is such a key
is used as it is, so the history of a series such as ``nightly-eval`` keeps its key. Any other name
has its characters outside that set replaced by dashes and the first 8 hex digits of its SHA-256
added, so ``Nightly Eval`` and ``nightly-eval``, or two names in another script, stay two keys.
"""

from __future__ import annotations

import hashlib

from prefect_rollouts.keys import slug

ARTIFACT_KEY_MAX = 100
"""Prefect's limit on an artifact key's length."""
VARIABLE_NAME_MAX = 255
"""Prefect's limit on a Variable name's length."""
VARIABLE_PREFIX = "prefect-rollouts-baseline-"


def prefect_key(prefix: str, name: str, limit: int = ARTIFACT_KEY_MAX) -> str:
    """``prefix + name`` when ``name`` is lowercase ASCII letters, digits and dashes and it fits in
    ``limit`` characters; else ``prefix`` + ``name`` made such (cut to fit) + ``-`` + 8 hex digits
    of the SHA-256 of ``name``."""
    room = limit - len(prefix)
    if name and len(name) <= room and all(c.isascii() and (c.isdigit() or c.islower() or c == "-") for c in name):
        return prefix + name
    safe = slug(name)
    return f"{prefix}{safe[:room - 9]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def summary_key(series: str) -> str:
    """The summary table artifact of every run of ``series``: ``eval-summary-<series>``."""
    return prefect_key("eval-summary-", series)


def spend_key(series: str) -> str:
    """The spend table artifact of every run of ``series`` (costliest tasks and rollouts): ``eval-spend-<series>``."""
    return prefect_key("eval-spend-", series)


def progress_key(run_id: str) -> str:
    """The progress artifact of run ``run_id``: ``eval-progress-<run id>``."""
    return prefect_key("eval-progress-", run_id)


def comparison_key(series: str) -> str:
    """The comparison artifact of ``series``: ``eval-comparison-<series>``."""
    return prefect_key("eval-comparison-", series)


def variable_name(series: str) -> str:
    """The Variable holding the baseline run of ``series``: ``prefect-rollouts-baseline-<series>``."""
    return prefect_key(VARIABLE_PREFIX, series, VARIABLE_NAME_MAX)
