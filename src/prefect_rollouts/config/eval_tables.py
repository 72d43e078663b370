"""The eval's own tables beside ``[env]``: ``[traces]`` (where the dataset is, checked writable before a run),
``[dispatch]`` (shards on a Prefect work pool) and ``[limits]`` (limits shared by every worker). ``EvalConfig``
(``config/eval.py``) holds one of each. Must not import Prefect.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, field_validator, model_validator

from prefect_rollouts.bounds import (
    MAX_BATCH,
    MAX_CONCURRENT,
)
from prefect_rollouts.config.base import ConfigModel
from prefect_rollouts.errors import ConfigError, TraceStoreError

if TYPE_CHECKING:
    from prefect_rollouts.traces.store import DatasetRoot


class TracesConfig(ConfigModel):
    """``[traces]``: where the Parquet dataset goes: a ``path`` (directory or URI) or a ``TraceStore`` block."""

    path: str | None = "./traces"
    """A local or shared directory, or an object-store URI such as ``s3://bucket/prefix``
    (credentials from the AWS environment, never in the URI)."""
    store: str | None = None
    """Name of a ``TraceStore`` block; wins over ``path``."""

    def dataset_root(self) -> DatasetRoot:
        """The dataset root of ``path`` (``./traces`` when unset); a ``store`` block is resolved by
        the Prefect layer (``blocks.resolve_trace_root``), not here.

        Raises:
            ConfigError: ``path`` is a URI that holds credentials or that pyarrow cannot open.
        """
        from prefect_rollouts.traces.store import dataset_root  # pyarrow loads only when a dataset is opened

        return dataset_root(self.path or "./traces")

    def check_writable(self) -> None:
        """Make sure files can be written under ``path`` (creating a directory), so a bad path is a
        config error before anything starts. A ``store`` block is checked where it is resolved.

        Raises:
            ConfigError: ``path`` is a file, sits under a file, or is a directory that cannot be
                created or written, or an object store refuses a write; the message names
                ``[traces] path`` and the cause.
        """
        if self.store or self.path is None:
            return
        if "://" in self.path:
            try:
                self.dataset_root().check_writable()
            except TraceStoreError as exc:
                raise ConfigError(f"[traces] path = {self.path!r}: {exc}. Check the bucket, the endpoint and the "
                                  "AWS credentials in the environment, or use a TraceStore block") from None
            return
        root = Path(self.path)
        fix = 'Choose a writable directory, or set [traces] store = "<TraceStore block name>"'
        if root.exists() and not root.is_dir():
            raise ConfigError(f"[traces] path = {self.path!r}: is a file, not a directory. {fix}")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"[traces] path = {self.path!r}: cannot create it ({exc.strerror or exc}). "
                              f"{fix}") from None
        try:
            with tempfile.TemporaryFile(dir=root, prefix=".write-check-"):
                pass
        except OSError as exc:
            raise ConfigError(f"[traces] path = {self.path!r}: cannot write files in it ({exc.strerror or exc}). "
                              f"{fix}") from None


class DispatchConfig(ConfigModel):
    """``[dispatch]``: run the eval's rollouts on a Prefect work pool, as shard flow runs that
    workers on any machine pick up. Without ``work_pool`` everything runs in the eval's process."""

    work_pool: str | None = None
    """Name of a Prefect work pool (``prefect work-pool create NAME --type process``) with workers
    (``prefect worker start --pool NAME``) that have this package installed."""
    shard_size: int = Field(25, ge=1, le=MAX_BATCH)
    """Rollouts per shard flow run. A shard pays a fixed dispatch cost (a flow run, a process, an
    agent; see ``benchmarks/distributed.py``), so keep shards to many seconds of work each. At most
    10,000 (``bounds.MAX_BATCH``: the shard's keys are a flow run parameter)."""
    max_shards_in_flight: int = Field(8, ge=1, le=MAX_CONCURRENT)
    """Shard flow runs submitted and not yet final at once. Each runs up to ``max_concurrent``
    rollouts, so up to ``max_shards_in_flight * max_concurrent`` rollouts are in flight. At most 1,000."""
    shard_attempts: int = Field(3, ge=1)
    """Submissions of a shard in all: a shard that ends Crashed or Failed with rollouts still
    without a row is submitted again with just those rollouts."""
    heartbeat_s: int = Field(30, ge=30)
    """Seconds between a shard flow run's heartbeats (Prefect's minimum is 30)."""
    crash_after_s: int = Field(90, ge=60)
    """A shard flow run without a heartbeat for this long is set to Crashed (its worker died) and
    submitted again. Keep it at least twice ``heartbeat_s``: a live shard must never look dead."""

    @model_validator(mode="after")
    def _crash_after_two_heartbeats(self) -> DispatchConfig:
        if self.crash_after_s < 2 * self.heartbeat_s:
            raise ValueError(f"crash_after_s = {self.crash_after_s}: must be at least twice heartbeat_s "
                             f"({self.heartbeat_s}), or a live shard could be marked Crashed")
        return self


class LimitsConfig(ConfigModel):
    """``[limits]``: Prefect global concurrency limits, shared by every process that runs the
    eval's rollouts (workers on other machines included) and by other evals naming the same limit.

    Each limit is created on the Prefect server with the size given here when it is missing. An
    existing limit keeps its size on the server (other evals share it); a different size here
    logs a warning that names the command to change it. A slot of a shared limit costs Prefect
    API calls (docs/scale-out.md, "Shared limits"); without these keys nothing is asked of Prefect.
    """

    model_requests: int | None = Field(None, ge=1)
    """Model requests in flight at once against each model endpoint the eval calls (the agent's,
    and a judge's own), all workers together. A slot is held for one HTTP attempt (not during a
    retry's wait). For a ``local/...`` model (one llama.cpp server per process) it is per process."""
    model_requests_name: str | None = None
    """Limit name for the agent's endpoint. Default: ``model-requests:<host>:<port>:<path>``
    from ``base_url`` (a loopback host is prefixed with the machine's host name), or
    ``model-requests:block:<name>`` for a ``ModelEndpoint`` block. A judge on another endpoint
    gets its endpoint's default name."""
    containers: int | None = Field(None, ge=1)
    """Containers alive at once (docker runtime), per Docker host unless ``containers_name``
    names one pool. Only a rollout's own container takes a slot: its isolated-scoring
    container runs under that slot (taking a second one could deadlock), so while scoring runs
    a host may briefly hold up to twice as many containers."""
    containers_name: str | None = None
    """One limit name for every worker's containers (a sandbox pool behind one ``DOCKER_HOST``,
    or one budget across machines). Default: ``containers:<host>:<port>`` of a ``tcp://`` or
    ``ssh://`` ``DOCKER_HOST``, else ``containers:<host name>`` of the machine running the rollout."""

    @field_validator("model_requests_name", "containers_name")
    @classmethod
    def _prefect_name(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or any(c in value for c in "/%&<>")):
            raise ValueError("Prefect limit names must be non-empty and cannot hold / % & < or >. "
                             "Choose another name, or remove the key for the default")
        return value
