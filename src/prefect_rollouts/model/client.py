"""The model client: one connection pool per agent, speaking the wire API its config names
(``ClientConfig.api``: chat completions, Responses or Messages; ``model.apis``).

The pool is split into lanes of at most 16 connections (one ``httpx.AsyncClient`` each, used
round-robin), because httpcore's per-request pool bookkeeping grows with the square of the
connections in one client (see ``_LANE_CONNECTIONS``).

With ``ClientConfig.stream`` the request asks for a stream and its server-sent events (``model.sse``)
go to the API's ``parse_events``, under the same timeout, retry and error rules as a plain response.

Retries (tenacity) on 429, 5xx, connect and read errors with exponential backoff and jitter,
honouring ``Retry-After``, bounded by ``ClientConfig.retries`` (count and total time). Each
failed attempt is kept (status, error) for the call's record. The API key is read from
the environment variable ``ClientConfig.api_key_env`` at each request, so it is never stored on
a config, a trace or a log line; the key and header values are registered with
``errors.register_secret`` and scrubbed from an error body before it is cut.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import random
import socket
import ssl
from typing import Any

import certifi
import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, stop_after_delay, stop_never

from prefect_rollouts import limits
from prefect_rollouts.config.agent import ClientConfig
from prefect_rollouts.errors import InfrastructureError, ProviderError, register_secret, scrub
from prefect_rollouts.model.apis import wire_api
from prefect_rollouts.model.completion import Completion
from prefect_rollouts.model.sse import read_events, text_lines
from prefect_rollouts.nesting import loads

#: Connections per httpx client. httpcore's pool does work per request that grows with the
#: square of its connections (it re-checks every connection's idleness for each one): two
#: 16-connection lanes served 32 in flight at 3 to 4 times one 32-connection client's rate
#: (benchmarks/README.md, "Model client lanes").
_LANE_CONNECTIONS = 16

logger = logging.getLogger("prefect_rollouts.model")

_RETRY_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))

#: Characters of an error body kept in a message (after scrubbing), and of a malformed body.
_BODY_CHARS, _MALFORMED_CHARS = 300, 200

_WARNED_UNSET: set[str] = set()
"""The ``api_key_env`` variables found unset in this process so far: each is warned about once, not
once per client (an eval makes an agent, and a client, per rollout)."""


class _Attempt(Exception):
    """A failed attempt; carries what the retry policy and the final ProviderError need."""

    def __init__(self, message: str, status_code: int | None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        """429, 5xx and failures without a response (a refused or dropped connection)."""
        return self.status_code is None or self.status_code in _RETRY_STATUS


class ModelClient:
    """Posts model requests for one agent in its wire API (``config.api``); share it across that
    agent's rollouts.

    Args:
        config: Endpoint, headers, per-request timeout (s), retries and pool size
            (``max_connections``, split into lanes of at most 16).
        api_key: A key from a ``ModelEndpoint`` block; when None the key is read from the
            environment variable ``config.api_key_env`` at each request.
        local: The endpoint is this process's own model server (``local/...``): an endpoint
            limit of ``[limits]`` applies per process (``prefect_rollouts.limits``).
    """

    def __init__(self, config: ClientConfig, api_key: str | None = None, *, local: bool = False) -> None:
        self.config = config
        self._api_key = api_key
        self._local = local
        self.api = wire_api(config.api)
        self.url = config.base_url.rstrip("/") + self.api.path
        self._shown_url = str(httpx.URL(self.url).copy_with(username=None, password=None))  # for messages
        self._address = _address(httpx.URL(self.url))
        lanes = -(-config.max_connections // _LANE_CONNECTIONS)
        per_lane = -(-config.max_connections // lanes)
        limits = httpx.Limits(max_connections=per_lane, max_keepalive_connections=per_lane)
        self._lanes = [httpx.AsyncClient(timeout=config.timeout, limits=limits, headers=config.header_values(),
                                         verify=_ssl_context()) for _ in range(lanes)]
        self._next_lane = itertools.cycle(self._lanes).__next__
        env_key = os.environ.get(config.api_key_env) if config.api_key_env and api_key is None else None
        for value in (api_key, env_key, *config.header_values().values()):
            register_secret(value)   # so text from outside (a tool's output) is scrubbed of it too
        retries = config.retries
        stop = stop_after_attempt(retries.max_retries + 1) | (
            stop_after_delay(retries.max_elapsed_s) if retries.max_elapsed_s else stop_never)
        self._retrying = AsyncRetrying(stop=stop, wait=self._wait, reraise=True,
                                       retry=retry_if_exception(lambda e: isinstance(e, _Attempt) and e.retryable))

    async def complete(self, body: dict[str, Any]) -> Completion:
        """POST ``body``, in the client's wire API, to ``{base_url}{api.path}`` and parse the response.

        Args:
            body: A chat-completions request (``model``, ``messages``, sampling keys, ``tools``...) whose
                messages are the trace's; ``self.api.request`` turns it into the wire API's own request
                (typed parts another API needs are left out; ``model.apis``).

        Returns:
            ``Completion``; ``retries`` counts attempts beyond the first, ``attempts`` holds
            each failed one (status, error scrubbed of secrets then cut).

        Raises:
            ProviderError: the last attempt failed (non-2xx, transport error, malformed body);
                ``status_code`` is the HTTP status; None when no response arrived (a refused,
                unresolvable or dropped connection), 504 for a timeout, 502 for a malformed body.
                ``retries`` and ``attempts`` (every failed attempt, the last included) are set on
                it as well.
        """
        extra, body = self.api.request_headers(body), self.api.request(body)
        if self.config.stream:
            body = self.api.streamed(body)
        failed: list[dict[str, Any]] = []
        try:
            async for attempt in self._retrying.copy():  # per call: the iterator keeps state
                with attempt:
                    try:
                        completion = await self._post(body, len(failed), extra)
                    except _Attempt as exc:
                        failed.append({"status_code": exc.status_code, "error": str(exc)})
                        raise
                    completion.attempts = failed
                    return completion
        except _Attempt as exc:
            count = len(failed)
            raise ProviderError(f"model endpoint: POST {self._shown_url} {exc} (after {count} attempt"
                                f"{'s' if count > 1 else ''})", status_code=exc.status_code,
                                retries=count - 1, attempts=failed) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        """Close the connection pool."""
        for lane in self._lanes:
            await lane.aclose()

    async def _post(self, body: dict[str, Any], retries: int, extra: dict[str, str]) -> Completion:
        key = self._key()
        headers = {**self.api.auth_headers(key), **extra} or None
        try:
            async with limits.request_slot(self.config, local=self._local):   # [limits] model_requests
                async with asyncio.timeout(self.config.timeout):  # httpx's timeouts are per read, not total
                    if self.config.stream:
                        response, events = await self._stream(body, headers)
                    else:
                        response, events = await self._next_lane().post(self.url, json=body, headers=headers), None
        except InfrastructureError as exc:   # no slot of the endpoint's limit could be asked for
            raise _Attempt(f"could not take a slot of its concurrency limit: {exc}", 503) from None
        except (httpx.TimeoutException, TimeoutError):
            raise _Attempt(f"timed out after {self.config.timeout:g} s", 504) from None
        except httpx.TransportError as exc:   # no response, so no HTTP status
            raise _Attempt(self._scrub(f"failed: {_transport_failure(exc, self._address)}", key), None) from None
        if response.status_code >= 300:
            hint = self._status_hint(response.status_code, key)
            body_text = self._scrub(response.text, key)[:_BODY_CHARS]   # scrub first: a cut could halve a key
            raise _Attempt(f"returned {response.status_code}: {body_text}{hint}",
                           response.status_code, self.api.retry_after(response.headers))
        try:
            if events is not None:
                return self.api.parse_events(events, retries, response.status_code)
            return self.api.parse(loads(response.content, "the body"), retries, response.status_code)   # depth bounded
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            text = response.text if events is None else "\n".join(data for _, data in events[-3:])
            body_text = self._scrub(text, key)[:_MALFORMED_CHARS]
            raise _Attempt(self._scrub(f"returned a malformed body ({type(exc).__name__}: {exc}): "
                                       f"{body_text!r}", key), 502) from None

    async def _stream(self, body: dict[str, Any],
                      headers: dict[str, str] | None) -> tuple[httpx.Response, list[tuple[str, str]] | None]:
        """POST ``body`` for a stream: ``(the response, its server-sent events)``; the events None for a
        non-2xx answer (its body read whole, as a plain one) or a 2xx one that is not ``text/event-stream``
        (a server that ignored ``stream``: parsed as a plain body)."""
        async with self._next_lane().stream("POST", self.url, json=body, headers=headers) as response:
            if response.status_code >= 300 or "text/event-stream" not in response.headers.get("content-type", ""):
                await response.aread()
                return response, None
            try:
                return response, await read_events(text_lines(response.aiter_text()))
            except ValueError as exc:   # longer than MAX_STREAM_CHARS
                raise _Attempt(f"returned a malformed body ({exc})", 502) from None

    def _scrub(self, text: str, key: str | None) -> str:
        """``text`` with the API key, every header value and every other registered secret
        (should a server or an exception echo them) replaced by ``***``."""
        return scrub(text, (key or "", *self.config.header_values().values()))

    def _status_hint(self, status: int, key: str | None) -> str:
        """What to check after a 404 (the route) or a 401/403 (the key), naming the client's field; "" for
        any other status. Names the variable, never the key."""
        if status == 404:
            return f"; base_url usually ends in /v1, and the server must speak client.api = {self.config.api!r}"
        if status not in (401, 403):
            return ""
        if self._api_key is not None:
            return "; the server refused the ModelEndpoint block's key: set the block's api_key to a valid one"
        if not self.config.api_key_env:
            return "; no key was sent (client.api_key_env is empty): set it to the variable holding the key"
        if key is None:
            return (f"; no key was sent: client.api_key_env = {self.config.api_key_env!r} is not set. "
                    "Export it")
        return (f"; the server refused the key in client.api_key_env = {self.config.api_key_env!r}: "
                "export a valid key for this base_url")

    def _key(self) -> str | None:
        """The API key for this request (block key, else the environment variable), stripped."""
        if self._api_key is not None:
            return self._api_key.strip() or None
        if not self.config.api_key_env or self.config.endpoint:
            return None
        key = os.environ.get(self.config.api_key_env, "").strip()
        register_secret(key)
        if not key and self.config.api_key_env not in _WARNED_UNSET:
            _WARNED_UNSET.add(self.config.api_key_env)
            logger.warning("client.api_key_env = %r: the variable is not set; requests to %s go without "
                           "a key (Authorization, or x-api-key for Messages). Export it, or set api_key_env = \"\" "
                           "for a keyless server", self.config.api_key_env, self._shown_url)
        return key or None

    def _wait(self, state: RetryCallState) -> float:
        policy = self.config.retries
        backoff = min(policy.backoff_s * 2 ** min(state.attempt_number - 1, 30), policy.max_backoff_s)
        backoff *= random.uniform(0.5, 1.5)
        exc = state.outcome.exception() if state.outcome else None
        retry_after = getattr(exc, "retry_after", None)
        return max(backoff, min(retry_after, policy.max_backoff_s)) if retry_after is not None else backoff


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One certificate store per process (loading it costs ~45 ms; httpx would load it per client)."""
    return ssl.create_default_context(cafile=certifi.where())


def _address(url: httpx.URL) -> str:
    """``host:port`` of ``url`` (the scheme's default port when it names none)."""
    port = url.port or {"https": 443, "http": 80}.get(url.scheme)
    return f"{url.host}:{port}" if port else url.host


def _transport_failure(exc: httpx.TransportError, address: str) -> str:
    """What a request that got no response ran into, in words: ``connection refused to
    127.0.0.1:8000``, ``cannot resolve host ...``; else ``<httpx error type>: <message>``.

    httpx reports a refused connection as ``ConnectError: All connection attempts failed``; the
    ``OSError`` it stands for is further down the exception's cause chain.
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ConnectionRefusedError):
            return f"connection refused to {address}"
        if isinstance(cause, socket.gaierror):
            return f"cannot resolve host {address.rsplit(':', 1)[0]} ({cause.strerror or cause})"
        cause = cause.__cause__ or cause.__context__
    return f"{type(exc).__name__}: {exc}"
