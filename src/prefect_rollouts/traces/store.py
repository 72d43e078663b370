"""Where a trace dataset lives: a local or shared directory, or an object store, through pyarrow's filesystems.

A dataset root is a path (``./traces``, or a mounted share such as NFS) or a URI pyarrow understands
(``s3://bucket/prefix``, ``gs://bucket/prefix``, ``file:///data/traces``). S3 credentials come from
the usual AWS environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``~/.aws``, instance metadata); an S3-compatible server is named by ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``, or ``?endpoint_override=http://host:port`` in the URI. A ``TraceStore`` block
(``blocks/``) builds a ``DatasetRoot`` with its own credentials instead.

How ``DatasetRoot.write_file`` makes a file durable, so that a file is either whole or absent:

- a local or shared directory (NFS included): written under a hidden temporary name (``.name.tmp``,
  which readers skip) in its final directory, fsynced, renamed into place (atomic within a
  directory), then the directory is fsynced;
- an object store: the whole file is serialised in memory and sent in one request (a single PUT;
  pyarrow switches to a multipart upload only above its part size, 10 MB), and the store makes the
  object visible only once that request completes, never half of it. Nothing is renamed. The call
  returns after the store has acknowledged the write.

Every writer names its files uniquely (a time and a random 128-bit id), so writers on any number of
machines never write to the same file. Must not import Prefect.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pyarrow.fs as pafs

from prefect_rollouts.errors import ConfigError, TraceStoreError

#: URI query keys that carry credentials: refused, since a dataset URI reaches Prefect parameters and logs.
_SECRET_QUERY_KEYS = {"access_key", "secret_key", "session_token"}


@dataclass(frozen=True)
class DatasetRoot:
    """A dataset root on one filesystem: pyarrow's ``filesystem`` and the root's ``path`` inside it.

    ``uri`` names it in messages and logs and never holds a credential. Paths given to the
    methods are relative to the root, with ``/`` separators (``rollouts/date=.../part-x.parquet``).
    """

    filesystem: pafs.FileSystem
    path: str
    """The root inside ``filesystem``: an absolute local path, or ``bucket/prefix`` on an object store."""
    uri: str

    def __str__(self) -> str:
        return self.uri

    @property
    def is_local(self) -> bool:
        """True for a directory of this machine's file system (local disk or a mounted share)."""
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    def join(self, *parts: str) -> str:
        """The full path of ``parts`` under the root, for ``filesystem`` calls."""
        return "/".join([self.path.rstrip("/"), *(part.strip("/") for part in parts if part)])

    def write_file(self, relative: str, data: bytes) -> None:
        """Write ``data`` as the file ``relative`` atomically (see the module docstring for how on each store).

        Raises:
            TraceStoreError: the file cannot be written; the message names it and the cause.
        """
        target = self.join(relative)
        try:
            if self.is_local:
                _write_local(Path(target), data)
            else:
                with self.filesystem.open_output_stream(target) as stream:
                    stream.write(data)
        except OSError as exc:
            raise TraceStoreError(f"trace dataset {self.uri}: cannot write {relative} ({exc}). "
                                  "Check free space, permissions or credentials") from exc

    def read_file(self, relative: str) -> bytes | None:
        """The bytes of file ``relative``; None when it does not exist.

        Raises:
            TraceStoreError: it exists but cannot be read.
        """
        target = self.join(relative)
        try:
            if self.filesystem.get_file_info(target).type == pafs.FileType.NotFound:
                return None
            with self.filesystem.open_input_stream(target) as stream:
                return bytes(stream.read())
        except OSError as exc:
            raise TraceStoreError(f"trace dataset {self.uri}: cannot read {relative} ({exc})") from exc

    def exists(self, relative: str = "") -> bool:
        """Whether ``relative`` (a file, or a directory holding files) exists under the root."""
        try:
            return self.filesystem.get_file_info(self.join(relative)).type != pafs.FileType.NotFound
        except OSError as exc:
            raise TraceStoreError(f"trace dataset {self.uri}: cannot reach {relative or 'it'} ({exc})") from exc

    def list_files(self, relative: str) -> list[str]:
        """Paths (relative to the root, sorted) of the visible files under directory ``relative``,
        recursively; hidden files (``.`` or ``_`` prefix: temporary files) are left out."""
        base = self.join(relative)
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        except OSError as exc:
            raise TraceStoreError(f"trace dataset {self.uri}: cannot list {relative} ({exc})") from exc
        root = self.path.rstrip("/") + "/"
        return sorted(info.path.removeprefix(root) for info in infos
                      if info.type == pafs.FileType.File and not info.base_name.startswith((".", "_")))

    def list_dirs(self, relative: str) -> list[str]:
        """Names (sorted) of the directories directly under ``relative``, hidden ones left out;
        none when it does not exist. On an object store, the common prefixes below it."""
        base = self.join(relative)
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(base, recursive=False, allow_not_found=True))
        except OSError as exc:
            raise TraceStoreError(f"trace dataset {self.uri}: cannot list {relative} ({exc})") from exc
        return sorted(info.base_name for info in infos
                      if info.type == pafs.FileType.Directory and not info.base_name.startswith((".", "_")))

    def delete_file(self, relative: str) -> None:
        """Remove file ``relative`` (a missing file is fine).

        Raises:
            TraceStoreError: it exists and cannot be removed.
        """
        try:
            self.filesystem.delete_file(self.join(relative))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise TraceStoreError(f"trace dataset {self.uri}: cannot delete {relative} ({exc})") from exc

    def check_writable(self) -> None:
        """Write and remove a small hidden file at the root, so a wrong bucket, missing credentials or
        a read-only directory show up before an eval starts.

        Raises:
            TraceStoreError: the write or the removal failed; the message names the root and the cause.
        """
        probe = f".write-check-{uuid.uuid4().hex}"
        if self.is_local:
            try:
                self.filesystem.create_dir(self.path, recursive=True)
            except OSError as exc:
                raise TraceStoreError(f"trace dataset {self.uri}: cannot create it ({exc})") from exc
        self.write_file(probe, b"")
        self.delete_file(probe)


def dataset_root(root: str | Path | DatasetRoot) -> DatasetRoot:
    """Resolve a dataset root given as a path, a URI or an already resolved ``DatasetRoot``.

    Args:
        root: A local path (relative to the working directory), ``file://`` URI, or object-store
            URI such as ``s3://bucket/prefix`` (``?region=...``, ``?endpoint_override=...`` and
            pyarrow's other query options allowed; credentials are not).

    Returns:
        A ``DatasetRoot``. For S3, output streams open lazily (``allow_delayed_open``), so a file
        below the part size is one PUT; ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` supply the
        endpoint when the URI has none. Nothing is contacted yet.

    Raises:
        ConfigError: the URI holds credentials, or pyarrow has no filesystem for it; the message
            names the URI (credentials masked) and the fix.
    """
    if isinstance(root, DatasetRoot):
        return root
    text = str(root)
    if "://" not in text:
        return DatasetRoot(pafs.LocalFileSystem(), Path(text).expanduser().absolute().as_posix(), text)
    parts = urlsplit(text)
    query = dict(parse_qsl(parts.query))
    if parts.username or parts.password or _SECRET_QUERY_KEYS & set(query):
        shown = urlunsplit(parts._replace(netloc=parts.hostname or "", query=""))
        raise ConfigError(f"[traces] path = {shown!r} (credentials masked): a dataset URI must not hold credentials; "
                          "it reaches Prefect parameters and logs. Use the AWS environment variables "
                          "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or a TraceStore block")
    if parts.scheme == "s3":
        query.setdefault("allow_delayed_open", "true")
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_override" not in query:
            query["endpoint_override"] = endpoint
    try:
        filesystem, path = pafs.FileSystem.from_uri(urlunsplit(parts._replace(query=urlencode(query))))
    except (ValueError, OSError) as exc:   # pyarrow.ArrowInvalid is a ValueError
        raise ConfigError(f"[traces] path = {text!r}: pyarrow cannot open this dataset location ({exc}). "
                          "Use a directory path or a URI such as s3://bucket/prefix") from None
    return DatasetRoot(filesystem, path, text)


def _write_local(target: Path, data: bytes) -> None:
    """Write through a hidden temporary file in ``target``'s directory: fsync, rename, fsync the directory."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
