"""An S3-compatible server on loopback for the object-store tests: moto's server mode in a thread."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow.fs as pafs
from moto.server import ThreadedMotoServer

#: moto accepts any credentials; pyarrow needs some to sign requests.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
               "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def moto_s3() -> Iterator[str]:
    """Start moto's S3 server on 127.0.0.1 (a free port) and yield its endpoint URL."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)   # one INFO line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def new_bucket(endpoint: str) -> str:
    """Create a bucket with a fresh name on the server at ``endpoint`` and return the name."""
    name = f"traces-{uuid.uuid4().hex[:12]}"
    filesystem = pafs.S3FileSystem(endpoint_override=endpoint, allow_bucket_creation=True,
                                   access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                   secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region="us-east-1")
    filesystem.create_dir(name)
    return name
