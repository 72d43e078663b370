"""Scripted OpenAI-compatible chat-completions server for tests (real sockets, 127.0.0.1).

Each ``POST /v1/chat/completions`` consumes the next *step* of the script; once it is
exhausted ``server.default`` answers (``None`` -> HTTP 500 "script exhausted").
``GET /v1/models`` lists one model (not recorded); other paths get 404. Every POST is
recorded in ``server.requests`` before its step is chosen; ``server.max_in_flight`` is the most
chat-completions POSTs being answered at once (a ``delayed`` step counts while it sleeps).

    with ScriptedOpenAIServer() as server:
        server.play([tool_call("search", query="x"), status(429, headers={"Retry-After": "0"}),
                     delayed(0.2, reply("done")), lambda req: reply(str(len(req.messages)))])
        client = SomeOpenAIClient(base_url=server.base_url, api_key="test")
        ...
        assert server.requests[0].headers["authorization"] == "Bearer test"

A step is ``reply``/``tool_call``/``tool_calls``/``status``/``delayed``/``malformed``/``echo_header``
or a callable ``fn(RecordedRequest) -> step``. An exception raised while producing a step
becomes a 500 response and is kept in ``server.errors``.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT_PATH = "/v1/chat/completions"
ROUTES: dict[str, Any] = {}
"""Further POST routes, each ``path -> render(server, step, request) -> (status, headers, body)`` for a
step that is not ``status``/``delayed``/``gathered`` (a sibling module registers its API's:
``responses_server``). The script, recording and counting are shared with chat completions."""
MODELS = {"object": "list", "data": [{"id": "scripted", "object": "model"}]}
Response = tuple[int, dict[str, str], bytes]


@dataclass
class RecordedRequest:
    """One received POST: path (no query string), lower-cased headers, parsed JSON body."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]  # {"_raw": text} when the body is not a JSON object

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's ``messages`` list (empty if absent)."""
        return self.body.get("messages", [])


@dataclass(frozen=True)
class _Reply:
    content: str | None
    finish_reason: str = "stop"
    usage: dict[str, Any] | None = None
    model: str = "scripted"
    calls: tuple[tuple[str, str], ...] = ()  # (function name, arguments string)


@dataclass(frozen=True)
class _Status:
    code: int
    body: Any = None  # dict -> JSON; str -> sent verbatim
    headers: dict[str, str] | None = None


@dataclass(frozen=True)
class _Delayed:
    seconds: float
    step: Any


@dataclass(frozen=True)
class _Gathered:
    in_flight: int
    timeout_s: float
    step: Any


def reply(content: str = "", finish_reason: str = "stop", usage: dict[str, Any] | None = None,
          model: str = "scripted") -> _Reply:
    """A 200 assistant message; default usage: 10 prompt tokens per request message. ``usage`` is
    sent as given (nested ``prompt_tokens_details`` / ``completion_tokens_details`` included)."""
    return _Reply(content, finish_reason, usage, model)


def tool_call(name: str, /, *, raw_arguments: str | None = None, **arguments: Any) -> _Reply:
    """A reply with one tool call; ``raw_arguments`` (verbatim string) overrides ``arguments``."""
    return _Reply(None, "tool_calls", calls=((name, raw_arguments if raw_arguments is not None
                                              else json.dumps(arguments)),))


def tool_calls(*calls: tuple[str, dict[str, Any] | str], content: str | None = None) -> _Reply:
    """A reply with several tool calls, each ``(name, arguments_dict_or_raw_string)``."""
    return _Reply(content, "tool_calls", calls=tuple(
        (name, args if isinstance(args, str) else json.dumps(args)) for name, args in calls))


def status(code: int, body: Any = None, headers: dict[str, str] | None = None) -> _Status:
    """An HTTP ``code`` response; default body ``{"error": {"message": "scripted <code>"}}``."""
    return _Status(code, body, headers)


def delayed(seconds: float, step: Any) -> _Delayed:
    """Sleep ``seconds`` in the handler thread, then answer with ``step``."""
    return _Delayed(seconds, step)


def gathered(in_flight: int, step: Any, timeout_s: float = 5.0) -> _Gathered:
    """Hold the answer until ``in_flight`` requests have been in the server at once (``max_in_flight``;
    or until ``timeout_s`` passed), then answer with ``step``. A test of a concurrency limit uses it
    so that requests the limit lets overlap do overlap however slowly the machine starts them; a
    limit that serialises them costs ``timeout_s`` per request and shows as ``max_in_flight`` 1."""
    return _Gathered(in_flight, timeout_s, step)


def malformed(text: str = "not json") -> _Status:
    """A 200 response labelled ``application/json`` whose body is ``text`` (not JSON)."""
    return _Status(200, text)


def echo_header(code: int, *, at: int, header: str = "authorization", size: int = 600) -> Any:
    """A step answering ``code`` with a ``size``-character text body (``x`` padding) that holds the
    request's ``header`` value starting at character ``at``, as a proxy echoing it might. A 200
    body is not JSON, so the client sees a malformed body."""
    def step(request: RecordedRequest) -> _Status:
        value = request.headers.get(header, "")
        body = ("x" * at + value).ljust(size, "x")
        return _Status(code, body)
    return step


def secret_fragments(text: str, secret: str, length: int = 4) -> list[str]:
    """The ``length``-character pieces of ``secret`` found in ``text`` (any longer piece holds one)."""
    pieces = {secret[i:i + length] for i in range(len(secret) - length + 1)}
    return sorted(piece for piece in pieces if piece in text)


def repeat(step: Any, n: int) -> list[Any]:
    """``n`` copies of ``step`` (for ``server.play``)."""
    return [step] * n


def _json(code: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
    return code, {"Content-Type": "application/json", **(headers or {})}, json.dumps(obj).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms ACK stall
        self.server.track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        found = self.path.split("?", 1)[0] == "/v1/models"
        self._send(_json(200, MODELS) if found else _json(404, {"error": {"message": "not found"}}))

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode("utf-8", "replace")
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self._send(self.server.owner._handle(RecordedRequest(
            self.path.split("?", 1)[0], {k.lower(): v for k, v in self.headers.items()},
            body if isinstance(body, dict) else {"_raw": raw})))

    def _send(self, response: Response) -> None:
        code, headers, payload = response
        try:
            self.send_response(code)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # client went away (e.g. it timed out during a delayed step)
            self.close_connection = True


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # default listen backlog of 5 drops SYNs under bursts -> 1 s stalls

    def __init__(self, owner: ScriptedOpenAIServer) -> None:
        self.owner, self.connections, self.conn_lock = owner, set(), threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def server_bind(self) -> None:  # skip HTTPServer's socket.getfqdn() (slow reverse DNS)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]

    def track(self, conn: socket.socket, add: bool) -> None:
        with self.conn_lock:
            (self.connections.add if add else self.connections.discard)(conn)


class ScriptedOpenAIServer:
    """OpenAI-compatible server in a daemon thread, answering from a script of steps. A server of
    another wire API subclasses it (``path``, ``_answer``, ``_error_body``: tests/fakes/anthropic_server.py)."""

    path = CHAT_PATH
    """The POST route that consumes script steps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._script: deque[Any] = deque()
        self._ids: dict[str, int] = {}  # per-kind counters; never reset, so ids stay unique
        self._httpd: _HTTPServer | None = None
        self.default: Any = None
        self.requests: list[RecordedRequest] = []
        self.errors: list[BaseException] = []
        self.in_flight = 0
        self.max_in_flight = 0
        """Most chat-completions requests being answered at once since the last ``reset`` (requests
        received before it, such as a ``delayed`` step a timed-out client left behind, are not counted)."""
        self._generation = 0

    def start(self) -> ScriptedOpenAIServer:
        """Bind a free port on 127.0.0.1 and start serving (no-op if already started)."""
        if self._httpd is None:
            self._httpd = _HTTPServer(self)
            threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving and close open keep-alive connections. Idempotent."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()  # returns once serve_forever has exited
            httpd.server_close()
            with httpd.conn_lock:
                for conn in httpd.connections:
                    try:
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` (the server must be started)."""
        if self._httpd is None:
            raise RuntimeError("ScriptedOpenAIServer is not started")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def play(self, steps: list[Any]) -> None:
        """Replace the script; each chat-completions POST consumes the next step."""
        with self._lock:
            self._script = deque(steps)

    @property
    def remaining(self) -> int:
        """Number of script steps not consumed yet."""
        with self._lock:
            return len(self._script)

    def reset(self) -> None:
        """Clear the script, recorded requests, errors and the default step."""
        with self._lock:
            self._script.clear()
            self.requests.clear()
            self.errors.clear()
            self.default = None
            self._generation += 1
            self.in_flight = self.max_in_flight = 0

    def _next_id(self, kind: str) -> int:
        with self._lock:
            self._ids[kind] = self._ids.get(kind, 0) + 1
            return self._ids[kind]

    def _handle(self, request: RecordedRequest) -> Response:
        with self._lock:
            self.requests.append(request)
            if request.path != self.path and request.path not in ROUTES:
                return _json(404, {"error": {"message": f"no route for POST {request.path}"}})
            step = self._script.popleft() if self._script else self.default
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            generation = self._generation
        try:
            if step is None:
                return _json(500, {"error": {"message": "script exhausted"}})
            return self._respond(step, request)
        except Exception as exc:  # e.g. a buggy callable step: answer 500, keep the error
            self.errors.append(exc)
            return _json(500, {"error": {"message": f"scripted step raised {exc!r}"}})
        finally:
            with self._lock:
                if generation == self._generation:
                    self.in_flight -= 1

    def _respond(self, step: Any, request: RecordedRequest) -> Response:
        while callable(step):
            step = step(request)
        if isinstance(step, _Delayed):
            time.sleep(step.seconds)
            return self._respond(step.step, request)
        if isinstance(step, _Gathered):
            deadline = time.monotonic() + step.timeout_s
            while self.max_in_flight < step.in_flight and time.monotonic() < deadline:
                time.sleep(0.01)
            return self._respond(step.step, request)
        if isinstance(step, _Status):
            if isinstance(step.body, str):  # sent verbatim (malformed JSON, HTML error page, ...)
                headers = {"Content-Type": "application/json", **(step.headers or {})}
                return step.code, headers, step.body.encode()
            body = step.body if step.body is not None else self._error_body(step.code)
            return _json(step.code, body, step.headers)
        if request.path in ROUTES:
            return ROUTES[request.path](self, step, request)
        if not isinstance(step, _Reply):
            raise TypeError(f"not a step: {step!r}")
        return self._answer(step, request)

    def _error_body(self, code: int) -> dict[str, Any]:
        """A ``status`` step's default body."""
        return {"error": {"message": f"scripted {code}"}}

    def _answer(self, step: _Reply, request: RecordedRequest) -> Response:
        """The 200 response of a ``reply``/``tool_call``/``tool_calls`` step."""
        message: dict[str, Any] = {"role": "assistant", "content": step.content}
        if step.calls:
            message["tool_calls"] = [{"id": f"call_{self._next_id('call')}", "type": "function",
                                      "function": {"name": name, "arguments": args}}
                                     for name, args in step.calls]
        prompt, completion = len(request.messages) * 10, max(1, len((step.content or "").split()))
        body = {
            "id": f"chatcmpl-{self._next_id('chatcmpl')}", "object": "chat.completion",
            "created": int(time.time()), "model": step.model,
            "choices": [{"index": 0, "message": message, "finish_reason": step.finish_reason}],
            "usage": step.usage or {"prompt_tokens": prompt, "completion_tokens": completion,
                                    "total_tokens": prompt + completion}}
        return _chat_stream(body, request) if request.body.get("stream") is True else _json(200, body)


def _chat_stream(body: dict[str, Any], request: RecordedRequest) -> Response:
    """``body`` (a chat.completion) as ``chat.completion.chunk`` events, as OpenAI streams: the role,
    the content in two pieces, each tool call's id and name then its arguments in two pieces, the finish
    reason, the usage chunk when ``stream_options.include_usage``, ``[DONE]``."""
    base = {key: body[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice, chunks = body["choices"][0], []
    message, text = choice["message"], choice["message"]["content"] or ""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> None:
        chunks.append({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    chunk({"role": "assistant", "content": ""})
    for piece in (text[:len(text) // 2], text[len(text) // 2:]) if text else ():
        chunk({"content": piece})
    for index, call in enumerate(message.get("tool_calls") or []):
        arguments = call["function"]["arguments"]
        chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                               "function": {"name": call["function"]["name"], "arguments": ""}}]})
        for piece in (arguments[:len(arguments) // 2], arguments[len(arguments) // 2:]):
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    chunk({}, choice["finish_reason"])
    if (request.body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    text_body = "".join(f"data: {json.dumps(item)}\n\n" for item in chunks) + "data: [DONE]\n\n"
    return 200, {"Content-Type": "text/event-stream"}, text_body.encode()
