"""Network policies: ``"open"``, ``"none"``, or ``allow`` / ``block`` rules (docs/network.md).

A policy is one of:

- ``"open"``: the runtime's Docker network as it is, nothing checked or logged;
- ``"none"``: no network interface but loopback;
- ``{ allow = [...], block = [...] }``: only what the rules let through, enforced by the agent's
  egress proxy (``runtimes/egress/proxy.py``) and logged on the trace. ``allow`` left out means every
  host (``["*"]``); ``allow = []`` means none. ``block`` wins over ``allow``.

A rule is one of (letters are compared lower-case):

- ``*``: every host and port;
- a host, ``pypi.org``, or a host glob, ``*.pythonhosted.org`` (which also matches
  ``pythonhosted.org`` itself), or an IPv4 address: ports 80 and 443, either scheme;
- ``host:port`` (glob allowed): that port only, either scheme;
- a URL origin, ``https://host[:port]`` or ``http://host[:port]``: that scheme and port (the
  scheme's default port when none is given). A ``CONNECT`` tunnel counts as ``https``, a plain
  proxied request as ``http``.

In ``block``, a bare host or glob blocks every port of it (``block = ["evil.example"]`` keeps the
whole host out); ``host:port`` and origins block what they name.

Only a leading ``*.`` is a glob. ``*`` and globs never reach a loopback, link-local (cloud metadata
at 169.254.169.254) or unspecified address, nor any address of this machine (its interfaces', a
Docker network's gateway): name the host or address exactly to allow one
(``runtimes/egress/address.py``, which also refuses the proxy's own ports always).

A task may bring its own agent-phase policy (``TaskData.network``, a Harbor task's network mode);
``compose`` joins it with the agent's as verifiers does: an open side or ``allow = ["*"]`` takes
the other's allow list, two concrete lists keep the rules written identically in both (no glob
overlap is guessed), blocks add up, and ``none`` on either side is ``none``.

Must not import Prefect.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import field_validator, model_validator

from prefect_rollouts.config.base import ConfigModel

DEFAULT_PORTS = {"http": 80, "https": 443}
"""The port a URL-origin rule means when it names none."""

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST = re.compile(rf"^(?:\*\.)?(?:{_LABEL}\.)*{_LABEL}$")


@dataclass(frozen=True, slots=True)
class Rule:
    """One parsed rule (``parse_rule``).

    Attributes:
        text: The rule as normalised (lower case), e.g. ``https://api.example.com:8443``.
        host: The host without a glob (``example.com`` for ``*.example.com``); ``""`` for ``*``.
        glob: True for ``*.host``; also True for ``*``.
        port: The one port it allows; None = 80 and 443 (a bare host), or any (``*``).
        scheme: ``http`` or ``https``; None = either.
    """

    text: str
    host: str
    glob: bool
    port: int | None
    scheme: str | None

    @property
    def everything(self) -> bool:
        """True for ``*``."""
        return self.text == "*"

    @property
    def exact(self) -> bool:
        """True when it names one host (no ``*``): only such a rule reaches a loopback address."""
        return not self.glob

    def matches(self, scheme: str, host: str, port: int, *, blocking: bool = False) -> bool:
        """Whether a connection to ``host:port`` (``scheme``: ``http`` or ``https``) is one this rule
        names; ``blocking``: as a block rule, where a bare host or glob names every port."""
        if self.everything:
            return True
        if self.scheme is not None and scheme != self.scheme:
            return False
        if not (blocking and self.bare) and port not in self._ports():
            return False
        host = host.lower().rstrip(".")
        return host == self.host or (self.glob and host.endswith("." + self.host))

    @property
    def bare(self) -> bool:
        """A host or glob with neither port nor scheme."""
        return self.port is None and self.scheme is None

    def covers(self, other: Rule) -> bool:
        """True when every connection the allow rule ``other`` names, this block rule blocks."""
        if self.everything:
            return True
        if other.everything or (other.glob and not self.glob):
            return False
        if not (other.host == self.host or (self.glob and other.host.endswith("." + self.host))):
            return False
        return self.bare or (other._ports() <= self._ports() and other._schemes() <= self._schemes())

    def _ports(self) -> frozenset[int]:
        if self.port is not None:
            return frozenset({self.port})
        if self.scheme is not None:
            return frozenset({DEFAULT_PORTS[self.scheme]})
        return frozenset({80, 443})

    def _schemes(self) -> frozenset[str]:
        return frozenset({self.scheme}) if self.scheme else frozenset(DEFAULT_PORTS)


def parse_rule(text: str) -> Rule:
    """Parse one rule (the forms in the module docstring).

    Raises:
        ValueError: the rule is malformed; the message names it and what to write instead.
    """
    raw = text
    text = text.strip().lower()
    if text == "*":
        return Rule("*", "", True, None, None)

    def bad(why: str) -> ValueError:
        return ValueError(f"network rule {raw!r}: {why}")
    scheme = None
    if "://" in text:
        scheme, text = text.split("://", 1)
        if scheme not in DEFAULT_PORTS:
            raise bad(f"scheme {scheme!r}: use http:// or https://, or a bare host")
        if text.endswith("/") and text.count("/") == 1:
            text = text[:-1]
    if not text:
        raise bad("no host; write a host such as pypi.org, *.example.com or https://api.example.com")
    if "/" in text or "?" in text or "#" in text:
        raise bad("a rule names a host or an origin, not a path; drop everything from the first '/'")
    if text.startswith("["):
        raise bad("IPv6 is off in restricted runtimes; name an IPv4 address or a host")
    host, port = text, None
    if ":" in text:
        host, _, digits = text.rpartition(":")
        if not (digits.isascii() and digits.isdigit()) or not 1 <= int(digits) <= 65535:
            raise bad(f"port {digits!r}: must be a number from 1 to 65535")
        port = int(digits)
    if host.endswith(".") and host != "*.":
        host = host[:-1]   # a fully qualified name: "pypi.org." is pypi.org
    if host in ("*", "*."):
        raise bad("'*' alone allows every host and port; a glob needs a domain after it, e.g. *.example.com")
    if "*" in host.removeprefix("*.") or not _HOST.match(host):
        raise bad("not a host name; only a leading '*.' is a glob (e.g. *.example.com), labels are letters, "
                  "digits, '-' and '_'")
    normal = (f"{scheme}://" if scheme else "") + host + (f":{port}" if port is not None else "")
    return Rule(normal, host.removeprefix("*."), host.startswith("*."), port, scheme)


def is_special_address(address: str) -> bool:
    """True for a loopback, link-local, unspecified or multicast address (``*`` and globs do not reach those)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast


class NetworkPolicy(ConfigModel):
    """Network access of a runtime (module docstring). TOML and Python also accept ``"open"`` or
    ``"none"``, and a table ``{ allow = [...], block = [...] }`` (``mode`` is then ``rules``)."""

    mode: Literal["open", "none", "rules"] = "open"
    """``open``: unrestricted. ``none``: loopback only. ``rules``: ``allow`` and ``block`` (docker runtime only)."""
    allow: list[str] | None = None
    """``rules``: what may be reached; None = every host (``["*"]``), ``[]`` = nothing."""
    block: list[str] = []
    """``rules``: what may not be reached, even when ``allow`` names it."""

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value == "rules":
                raise ValueError('"rules" is not a policy by itself: write network = { allow = [...], block = [...] }')
            return {"mode": value}
        if isinstance(value, list):
            raise ValueError('network is "open", "none" or a table of rules; for a list of hosts write '
                             "network = { allow = [...] }")
        if isinstance(value, dict) and value.get("mode") in ("open", "none") and value.get("allow") == [] and \
                not value.get("block"):
            value = {key: item for key, item in value.items() if key != "allow"}   # a config stored before rules
        if isinstance(value, dict) and (value.get("allow") is not None or value.get("block")):
            if value.get("mode", "rules") != "rules":
                raise ValueError(f"mode = {value['mode']!r} with allow/block: drop mode (a table of rules is "
                                 'mode "rules"), or drop allow and block')
            return {**value, "mode": "rules"}
        return value

    @field_validator("allow", "block")
    @classmethod
    def _rules(cls, rules: list[str] | None) -> list[str] | None:
        return None if rules is None else list(dict.fromkeys(parse_rule(rule).text for rule in rules))

    @model_validator(mode="after")
    def _consistent(self) -> NetworkPolicy:
        if self.mode != "rules" and (self.allow is not None or self.block):
            raise ValueError(f'mode = "{self.mode}" takes no allow or block; write network = {{ allow = [...], '
                             "block = [...] }} for rules")
        if "*" in self.block and self.allow is None:
            raise ValueError("block = ['*'] with allow left out blocks everything: write allow = [] (nothing but "
                             'the harness endpoint) or network = "none"')
        if "*" in self.block and self.allow:
            raise ValueError(f"block = ['*'] blocks everything, so allow = {self.allow!r} does nothing; write "
                             'allow = [] (nothing but the harness endpoint) or network = "none"')
        for allowed in self.allow or []:
            rule = parse_rule(allowed)
            if covering := next((b for b in self.block if parse_rule(b).covers(rule)), None):
                raise ValueError(f"allow rule {allowed!r} is wholly inside block rule {covering!r} (block wins), "
                                 "so it does nothing; remove one of them. A block inside an allow is fine: "
                                 "allow = ['*.example.com'], block = ['api.example.com'] keeps api out")
        return self

    def describe(self) -> str | dict[str, Any]:
        """``"open"``, ``"none"``, or ``{"allow": [...] or None, "block": [...]}`` (for a trace's info)."""
        return self.mode if self.mode != "rules" else {"allow": self.allow, "block": self.block}

    @functools.cached_property
    def allow_rules(self) -> list[Rule]:
        """``allow`` parsed (once: the proxy asks for every request); ``*`` when it is None."""
        return [parse_rule(rule) for rule in (["*"] if self.allow is None else self.allow)]

    @functools.cached_property
    def block_rules(self) -> list[Rule]:
        """``block`` parsed (once)."""
        return [parse_rule(rule) for rule in self.block]

    def decide(self, scheme: str, host: str, port: int) -> tuple[bool, str, Rule | None]:
        """``(allowed, reason, the allow rule that matched)`` for a connection to ``host:port``.

        ``open`` allows everything and ``none`` nothing; under ``rules`` a matching block rule
        denies, else the first matching allow rule allows, else it is denied. The caller still
        refuses an address of this machine (``runtimes/egress_address.refusal``) that only ``*`` or
        a glob allowed.
        """
        if self.mode == "open":
            return True, 'network = "open"', parse_rule("*")
        if self.mode == "none":
            return False, 'network = "none"', None
        blocked = next((rule for rule in self.block_rules if rule.matches(scheme, host, port, blocking=True)), None)
        if blocked is not None:
            return False, f"blocked by rule {blocked.text!r}", None
        if allowed := next((rule for rule in self.allow_rules if rule.matches(scheme, host, port)), None):
            return True, f"allowed by rule {allowed.text!r}", allowed
        return False, ("allow = [] lets nothing through" if self.allow == [] else
                       f"no allow rule names {scheme}://{host}:{port} (allow = {self.allow!r})"), None


def compose(agent: NetworkPolicy, task: NetworkPolicy | None) -> NetworkPolicy:
    """The agent-phase policy of a rollout: the agent's ``runtime.network`` joined with the task's
    default (module docstring); ``task`` None or ``open`` leaves the agent's as it is."""
    if task is None or task.mode == "open" or agent == task:
        return agent
    if agent.mode == "open":
        return task
    if "none" in (agent.mode, task.mode):
        return NetworkPolicy(mode="none")
    ours, theirs = agent.allow, task.allow
    allow = theirs if ours is None else ours if theirs is None else [rule for rule in ours if rule in theirs]
    block = list(dict.fromkeys([*agent.block, *task.block]))
    allowed = [rule for rule in allow or [] if not any(parse_rule(b).covers(parse_rule(rule)) for b in block)]
    return NetworkPolicy(allow=allowed if allow is not None else None, block=block)
