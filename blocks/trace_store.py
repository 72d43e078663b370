"""The ``TraceStore`` block: where a trace dataset lives, with the object-store credentials it needs."""

from __future__ import annotations

from typing import cast
from urllib.parse import urlsplit

import pyarrow.fs as pafs
from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from prefect_rollouts.errors import ConfigError
from prefect_rollouts.traces.store import DatasetRoot, dataset_root


class TraceStore(Block):
    """Where an eval's Parquet trace dataset lives: a local or shared directory, or an object store.

    Credentials stay in the block (secret fields) and in memory while files are written; a config
    names only the block. Without them, S3 uses the usual AWS environment of the process that
    writes (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, instance metadata).

    Example:
        ```python
        from prefect_rollouts.blocks import TraceStore
        TraceStore(path="/data/traces").save("nightly")
        TraceStore(path="s3://evals/traces", endpoint_url="http://minio:9000",
                   access_key_id="...", secret_access_key="...").save("minio")
        ```
        then in TOML: ``[traces] store = "nightly"``.
    """

    _block_type_name = "Trace Store"
    _block_type_slug = "prefect-rollouts-trace-store"
    _description = "Location of a prefect-rollouts Parquet trace dataset (a directory or s3://bucket/prefix)."

    path: str = Field(description="Dataset root: a directory, or an object-store URI such as s3://bucket/prefix.")
    endpoint_url: str | None = Field(default=None, description="S3: endpoint of an S3-compatible server "
                                     "(e.g. http://minio:9000); default AWS.")
    region: str | None = Field(default=None, description="S3: the bucket's region; default from the AWS environment.")
    access_key_id: str | None = Field(default=None, description="S3: access key id; default from the AWS environment.")
    secret_access_key: SecretStr | None = Field(default=None, description="S3: secret access key.")
    session_token: SecretStr | None = Field(default=None, description="S3: session token of temporary credentials.")

    def dataset_root(self) -> DatasetRoot:
        """The dataset root, with an S3 filesystem built from the block's fields when ``path`` is
        ``s3://`` and any of them is set (output streams open lazily: a small file is one PUT).

        Raises:
            ConfigError: ``path`` is not a directory or a URI pyarrow can open, or holds credentials.
        """
        parts = urlsplit(self.path)
        options = (self.endpoint_url, self.region, self.access_key_id, self.secret_access_key, self.session_token)
        if parts.scheme != "s3" or not any(option is not None for option in options):
            return dataset_root(self.path)
        if parts.username or parts.password or parts.query:
            raise ConfigError(f"TraceStore path = s3://{parts.hostname}{parts.path}: give the endpoint, region and "
                              "credentials in the block's fields, not in the URI")
        secret, token = self.secret_access_key, self.session_token
        filesystem = pafs.S3FileSystem(
            access_key=self.access_key_id, secret_key=secret.get_secret_value() if secret else None,
            session_token=token.get_secret_value() if token else None, region=self.region,
            endpoint_override=self.endpoint_url, allow_delayed_open=True)
        return DatasetRoot(filesystem, f"{parts.netloc}{parts.path}".rstrip("/"), self.path)


async def resolve_trace_root(store: str) -> DatasetRoot:
    """The dataset root of the ``TraceStore`` block named ``store``.

    Raises:
        ConfigError: no such block, or its path cannot be opened.
    """
    try:
        block = cast(TraceStore, await TraceStore.aload(store))
    except ValueError as exc:
        raise ConfigError(f"[traces] store = {store!r}: no TraceStore block with that name ({exc}). "
                          f"Create it with TraceStore(path=...).save({store!r}), or set [traces] path") from None
    return block.dataset_root()


async def resolve_trace_path(store: str) -> str:
    """The ``path`` of the ``TraceStore`` block named ``store`` (a directory or URI; see ``resolve_trace_root``).

    Raises:
        ConfigError: no such block.
    """
    return (await resolve_trace_root(store)).uri
