"""The viewer's one HTML page and its Content-Security-Policy, for the server and the ``--html`` file alike.

The page holds our script and style inline, each allowed by its SHA-256 hash in the policy (no other
script runs: not one from the data, not an inline handler, not a ``javascript:`` URL), and the data as
``<script type="application/json">`` that the browser never executes; ``embed_json`` escapes ``<``, ``>``
and ``&`` so no text of a rollout can close that element. Images are ``data:`` URIs only (the plots).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from functools import cache
from importlib import resources
from typing import Any

from prefect_rollouts.errors import TraceStoreError


@cache
def asset(name: str) -> str:
    """The text of ``static/<name>`` (``app.js``, ``app.css``), shipped as package data."""
    return resources.files("prefect_rollouts.traces.view").joinpath("static", name).read_text(encoding="utf-8")


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def content_security_policy(*, served: bool, header: bool = True) -> str:
    """The page's policy: nothing by default; our script and style by hash; images from ``data:``; the
    server's own ``api/`` for a served page (``connect-src 'self'``), no connection at all for a file.
    ``frame-ancestors 'none'`` only in the served page's header (``header``): browsers ignore it in a
    ``<meta>`` and log an error to the console for it (CSP Level 3, 6.4.2)."""
    return "; ".join([
        "default-src 'none'", f"script-src {_hash(asset('app.js'))}", f"style-src {_hash(asset('app.css'))}",
        "img-src data:", "connect-src " + ("'self'" if served else "'none'"),
        "base-uri 'none'", "form-action 'none'", *(["frame-ancestors 'none'"] if served and header else [])])


def embed_json(data: Any) -> str:
    """``data`` as JSON safe inside ``<script type="application/json">``: ``<``, ``>`` and ``&`` as ``\\u``
    escapes (``JSON.parse`` reads them back as the same characters), so ``</script>`` or ``<!--`` in a
    rollout's text stays text."""
    text = json.dumps(finite(data), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None (JSON has no form for them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def render_page(data: dict[str, Any], *, served: bool) -> str:
    """The HTML page with ``data`` embedded: ``{"mode": "server", "token", "run"}`` for a served page,
    ``{"mode": "file", "runs", "rollouts", "details", "comparisons", "run"}`` for a file
    (``render.file_data``). The policy is also in a ``<meta>`` so a file opened from disk keeps it."""
    policy = content_security_policy(served=served, header=False)
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{policy}\">\n"
            "<meta name=\"referrer\" content=\"no-referrer\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            "<title>prefect-rollouts traces</title>\n"
            f"<style>{asset('app.css')}</style>\n</head><body><div id=\"app\"></div>\n"
            f"<script type=\"application/json\" id=\"viewer-data\">{embed_json(data)}</script>\n"
            f"<script>{asset('app.js')}</script>\n</body></html>\n")


def check_assets() -> None:
    """Raise ``TraceStoreError`` when the page's assets are missing from the installed package."""
    try:
        asset("app.js"), asset("app.css")
    except (OSError, ModuleNotFoundError) as exc:
        raise TraceStoreError(f"the viewer's page assets are missing ({exc}): reinstall prefect-rollouts") from exc
