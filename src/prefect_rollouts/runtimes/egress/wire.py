"""The egress proxy's reading of what a runtime sends: a proxy request head, a TLS ClientHello.

``parse_head`` refuses what the proxy could not check (a repeated ``Host``, a chunked body);
``client_hello`` joins a ClientHello spread over several TLS records; ``server_name`` reads its SNI
(RFC 6066). Pure functions over bytes. Must not import Prefect.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HELLO_BYTES = 64 * 1024
"""The longest TLS ClientHello read (it may span several records); a longer one closes the tunnel."""
_HOP_HEADERS = {"proxy-authorization", "proxy-connection", "connection", "keep-alive"}


@dataclass(slots=True)
class Request:
    """A proxy request's head: ``CONNECT host:port`` or an absolute-form plain request."""

    method: str
    target: str
    version: str
    host: str
    port: int
    headers: dict[str, str]
    lines: list[str]
    path: str = "/"

    @property
    def host_header(self) -> str | None:
        value = self.headers.get("host")
        if value is None:
            return None
        host = value.strip().lower()
        return host.rsplit(":", 1)[0] if host.count(":") == 1 else host

    @property
    def content_length(self) -> int:
        return int(self.headers.get("content-length", "0"))

    def origin_head(self) -> bytes:
        """The request head for the upstream: origin form, hop-by-hop headers dropped, ``Connection: close``."""
        kept = [line for line in self.lines[1:] if line.split(":", 1)[0].strip().lower() not in _HOP_HEADERS]
        return "\r\n".join([f"{self.method} {self.path} {self.version}", *kept, "Connection: close", "", ""]
                           ).encode("latin-1")


_SINGLE = {"host", "content-length", "transfer-encoding", "proxy-authorization"}


def parse_head(head: bytes) -> Request:
    """The proxy request in ``head`` (up to and including its blank line).

    Raises:
        ValueError: not a proxy request, or one the proxy cannot check (the message says which).
    """
    lines = head.decode("latin-1").split("\r\n")[:-2]
    parts = lines[0].split(" ") if lines else []
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError("not an HTTP proxy request (an absolute http:// URL, or CONNECT host:port for https)")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        key = name.lower()
        if not sep or not name or name != name.strip():
            raise ValueError(f"malformed header line {line[:100]!r}")
        if key in _SINGLE and key in headers:
            raise ValueError(f"the {name} header twice")
        headers[key] = value.strip()
    if method == "CONNECT":
        host, sep, digits = target.rpartition(":")
        if not sep or not _port(digits) or not host or host.startswith("["):
            raise ValueError(f"CONNECT {target[:100]!r}: write CONNECT host:port (IPv6 is off)")
        return Request(method, target, version, host.lower().rstrip("."), int(digits), headers, lines)
    url = urlsplit(target)
    if url.scheme != "http" or not url.hostname:
        raise ValueError("not a proxy request: a plain request names an absolute http:// URL; https goes through "
                         "CONNECT")
    try:
        port = url.port or 80
    except ValueError:
        raise ValueError(f"{target[:100]!r}: the port is not a number from 1 to 65535") from None
    if "transfer-encoding" in headers:
        raise ValueError("a chunked request body cannot be checked through this proxy; send Content-Length")
    if not _port(headers.get("content-length", "0"), upper=2**63):
        raise ValueError("Content-Length is not a number")
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    return Request(method, target, version, url.hostname.lower().rstrip("."), port, headers, lines, path)


def _port(digits: str, upper: int = 65535) -> bool:
    """ASCII digits naming a number from 1 (0 when ``upper`` is not a port's) to ``upper``."""
    return digits.isascii() and digits.isdigit() and (0 if upper != 65535 else 1) <= int(digits) <= upper


def client_hello(data: bytearray) -> tuple[str, str | None]:
    """``("wait", None)`` until the ClientHello in ``data`` is whole, then ``("hello", server name or
    None)``; ``("tls-free", None)`` when the tunnel's first bytes are not TLS; ``("bad", None)`` when
    they are TLS but no ClientHello can be read from them."""
    if not data:
        return "wait", None
    if data[0] != 0x16:
        return "tls-free", None
    handshake, at = bytearray(), 0
    while True:
        if len(data) < at + 5:
            return ("bad", None) if len(data) > MAX_HELLO_BYTES else ("wait", None)
        if data[at] != 0x16:
            return "bad", None   # another record type before the ClientHello was whole
        length = int.from_bytes(data[at + 3:at + 5], "big")
        if len(data) < at + 5 + length:
            return ("bad", None) if at + 5 + length > MAX_HELLO_BYTES + 5 else ("wait", None)
        handshake += data[at + 5:at + 5 + length]
        at += 5 + length
        if len(handshake) >= 4:
            need = 4 + int.from_bytes(handshake[1:4], "big")
            if handshake[0] != 1 or need > MAX_HELLO_BYTES:
                return "bad", None
            if len(handshake) >= need:
                try:
                    return "hello", server_name(bytes(handshake[:need]))
                except ValueError:
                    return "bad", None


def server_name(handshake: bytes) -> str | None:
    """The ``server_name`` (RFC 6066) of a whole TLS ClientHello handshake message (its 4-byte
    header included, the records' payloads joined), or None when it names none.

    Raises:
        ValueError: it is not a ClientHello, or a length in it runs past its end.
    """
    def need(upto: int) -> None:
        if upto > len(handshake):
            raise ValueError("the ClientHello is cut short")
    try:
        if handshake[0] != 1:
            raise ValueError("not a ClientHello")
        at = 4 + 2 + 32                                   # header, client version, random
        at += 1 + handshake[at]                           # session id
        need(at + 2)
        at += 2 + int.from_bytes(handshake[at:at + 2], "big")   # cipher suites
        need(at + 1)
        at += 1 + handshake[at]                           # compression methods
        if at == len(handshake):
            return None   # no extensions
        need(at + 2)
        end = at + 2 + int.from_bytes(handshake[at:at + 2], "big")
        need(end)
        at += 2
        while at + 4 <= end:
            kind, size = int.from_bytes(handshake[at:at + 2], "big"), int.from_bytes(handshake[at + 2:at + 4], "big")
            at += 4
            need(at + size)
            if kind == 0:   # server_name: list length, then (type 0, length, name)
                if size < 5 or handshake[at + 2] != 0:
                    raise ValueError("a server_name that is not a host name")
                name_length = int.from_bytes(handshake[at + 3:at + 5], "big")
                need(at + 5 + name_length)
                return handshake[at + 5:at + 5 + name_length].decode("ascii").lower().rstrip(".")
            at += size
    except IndexError:
        raise ValueError("the ClientHello is cut short") from None
    except UnicodeDecodeError:
        raise ValueError("a server name that is not ASCII") from None
    return None
