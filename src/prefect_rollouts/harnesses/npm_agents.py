"""The ``codex`` (Codex CLI) and ``claude-code`` (Claude Code) program harnesses: the npm packages, pinned.

Both are native binaries shipped in an npm package's optional dependency (docs/agents.md has the
figures): ``@openai/codex`` carries a static musl build (``codex-linux-<arch>``: runs in any Linux
image of its architecture, Alpine included); ``@anthropic-ai/claude-code`` a glibc build
(``claude-code-linux-<arch>``, dynamically linked against glibc >= 2.26: ``objdump -T`` of 2.1.328),
which its ``postinstall`` (``install.cjs``) hard-links over ``bin/claude.exe``. Neither needs Node in
the runtime; both come to it one of two ways, as mini-swe-agent does:

- **baked into the image**: ``prefect-rollouts sandbox build --with codex --with claude-code`` copies
  the install to ``/usr/local/<id>/<version>`` (``image_dir``); a rollout then installs nothing.
- **installed at setup**: otherwise setup runs ``npm install`` on the host, once per version and
  machine, into ``<cache>/<id>/<version>-<machine>`` (optional dependencies kept, scripts run: the
  postinstall must), which the docker runtime mounts read-only at ``/usr/local/prefect-rollouts/<id>``
  and the local runtime runs in place. The host needs Node and npm (Debian: ``apt-get install nodejs
  npm``) and the npm registry; the runtime needs neither, so both run under ``network = "none"``.

At setup the binary must answer ``--version`` in the runtime (``binary_in``): an image that cannot run
it (Claude Code on musl, another architecture) fails the rollout there with the reason, before any
model call. The in-runtime driver (``programs/npm_agent.py``) writes the agent's config, runs it
non-interactively and leaves its own transcript in the workspace at ``TRANSCRIPT``, which the program
harness moves onto the trace (``keep_transcript``).
"""

from __future__ import annotations

import asyncio
import platform
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_rollouts.errors import RuntimeUnavailableError, TaskError, scrub
from prefect_rollouts.harnesses.installs import install_once, run_installer
from prefect_rollouts.runtimes.base import cache_dir

if TYPE_CHECKING:
    from prefect_rollouts.runtimes import Runtime

_ARCH = {"x86_64": ("x64", "x86_64"), "aarch64": ("arm64", "aarch64"), "arm64": ("arm64", "aarch64")}
"""``uname -m`` -> (npm's cpu name, Rust's target prefix)."""


@dataclass(frozen=True, slots=True)
class NpmAgent:
    """One npm-packaged agent program.

    Attributes:
        id: The harness id (Harbor's name).
        package: The npm package.
        version: The pinned release (``HarnessConfig.version`` overrides it).
        binary: Path of the native binary inside an install, ``{npm_cpu}`` and ``{rust_arch}`` filled in.
        transcript: What the driver keeps of its run (docs/agents.md).
    """

    id: str
    package: str
    version: str
    binary: str
    transcript: str

    def binary_for(self, machine: str) -> str:
        """``binary`` for ``uname -m`` = ``machine``.

        Raises:
            TaskError: not an architecture the package ships (x86_64, aarch64).
        """
        if machine not in _ARCH:
            raise TaskError(f'harness "{self.id}": {self.package} has no build for {machine} (only x86_64 and '
                            "aarch64). Use a runtime of one of these")
        cpu, rust = _ARCH[machine]
        return self.binary.format(npm_cpu=cpu, rust_arch=rust)


AGENTS = {
    "codex": NpmAgent(
        "codex", "@openai/codex", "0.169.0",
        "node_modules/@openai/codex-linux-{npm_cpu}/vendor/{rust_arch}-unknown-linux-musl/bin/codex",
        "its session file ($CODEX_HOME/sessions/.../rollout-*.jsonl)"),
    "claude-code": NpmAgent(
        "claude-code", "@anthropic-ai/claude-code", "2.1.328",
        "node_modules/@anthropic-ai/claude-code/bin/claude.exe",
        "its stream-json stdout (--output-format stream-json --verbose)"),
}
"""The npm agents by harness id, with their pinned releases."""

MOUNTED = "/usr/local/prefect-rollouts"
"""The docker runtime mounts ``<cache>/<id>`` (read-only) at ``MOUNTED/<id>``."""

TRANSCRIPT = ".prefect-rollouts-transcript.jsonl"
"""Where the driver leaves the agent's transcript in the workspace; the harness takes it away."""

TRANSCRIPT_MAX_BYTES = 4 * 1024 * 1024
"""The most of a transcript kept on a trace (its end; ``transcript_bytes`` gives the whole size): the
trace's row holds it in memory, twice (``info`` and the full trace). A Codex session file starts at
~32 KB (its instructions and tools, recorded once) and grows by each exchange."""


def cache_root(agent: NpmAgent) -> Path:
    """The host directory holding ``agent``'s installs (created)."""
    return cache_dir(agent.id)


def image_dir(agent: NpmAgent, version: str) -> str:
    """Where ``sandbox build --with <id>`` puts release ``version`` in the image."""
    return f"/usr/local/{agent.id}/{version}"


def install(agent: NpmAgent, version: str | None = None, machine: str | None = None, *,
            root: Path | None = None, timeout_s: float = 900) -> Path:
    """Install ``agent``'s ``version`` (default: its pin) for this machine from the npm registry.

    ``npm install --omit=dev`` keeps the optional dependencies (the native binary) and runs
    install scripts (Claude Code's postinstall). Idempotent and safe from many processes at once
    (``installs.install_once``). Measured here: about 5 s and 400 MB (Codex), 360 MB (Claude Code).

    Returns:
        The install directory ``<root>/<version>-<machine>``, holding ``binary_for(machine)``.

    Raises:
        TaskError: ``machine`` is not this host's (npm installs the host's build), npm is missing,
            failed or ran longer than ``timeout_s``, or the binary is not where the package puts it.
    """
    version = version or agent.version
    host = platform.machine()
    machine = machine or host
    binary = agent.binary_for(machine)
    if _ARCH[machine][0] != _ARCH.get(host, ("",))[0]:
        raise TaskError(f'harness "{agent.id}": the runtime is {machine} but this host is {host}, and npm installs '
                        f"the host's build. Bake it into the image on a {machine} machine "
                        f"(`prefect-rollouts sandbox build --with {agent.id}`)")

    def build(scratch: Path) -> None:
        run_installer(["npm", "install", "--prefix", str(scratch), "--omit=dev", "--no-audit", "--no-fund",
                       "--no-update-notifier", "--loglevel=error", "--cache", str(scratch / ".tmp" / "npm"),
                       f"{agent.package}@{version}"],
                      timeout_s=timeout_s, tmp=scratch / ".tmp", cwd=scratch,
                      what=f'harness "{agent.id}": npm install {agent.package}@{version}',
                      fix="It needs Node and npm (Debian: apt-get install nodejs npm) and the npm registry where the "
                          f"rollout runs, or an image made with `prefect-rollouts sandbox build --with {agent.id}`")
        if not (scratch / binary).is_file():
            raise TaskError(f'harness "{agent.id}": npm installed {agent.package}@{version} but not its native '
                            f"binary {binary} (its optional dependency for {machine}, or its postinstall, did not "
                            "run: do not set npm's omit=optional or ignore-scripts)")

    return install_once(root or cache_root(agent), f"{version}-{machine}",
                        ready=lambda target: (target / binary).is_file(), build=build,
                        note=f"installing {agent.package}@{version} for {machine} with npm (about 5 s)")


async def binary_in(runtime: Runtime, agent: NpmAgent, version: str | None, *, local: bool,
                    timeout_s: float) -> tuple[str, str]:
    """The agent's binary as the runtime sees it (the image's, else the host install, made now if
    missing, as mounted), checked by running ``--version`` there.

    Returns:
        ``(binary path, what --version printed)``.

    Raises:
        TaskError: the install failed (``install``), or the binary does not run in this runtime (the
            reason: its exit code and output; for Claude Code on a musl image, say so).
    """
    version = version or agent.version
    if local:
        machine, baked = platform.machine(), False
    else:
        baked_dir = image_dir(agent, version)
        probe = await runtime.exec(f"uname -m; test -d {shlex.quote(baked_dir)} && echo baked", timeout=60)
        words = probe.stdout.split()
        if probe.exit_code not in (0, 1) or not words:
            raise TaskError(f'harness "{agent.id}": the runtime did not answer `uname -m` (exit {probe.exit_code}: '
                            f"{(probe.stderr or probe.stdout).strip()[-300:]})")
        machine, baked = words[0], words[-1] == "baked"
    relative = agent.binary_for(machine)
    if baked:
        binary = f"{image_dir(agent, version)}/{relative}"
    else:
        target = await asyncio.to_thread(install, agent, version, machine, timeout_s=timeout_s)
        binary = str(target / relative) if local else f"{MOUNTED}/{agent.id}/{target.name}/{relative}"
    check = await runtime.exec(f"{shlex.quote(binary)} --version", timeout=60)
    said = (check.stdout or check.stderr).strip()
    if check.exit_code != 0 or version not in said:
        libc = ("; Claude Code's binary needs glibc 2.26 or newer (Debian, Ubuntu, RHEL 8+; not Alpine's musl)"
                if agent.id == "claude-code" else "")
        raise TaskError(f'harness "{agent.id}": {agent.package}@{version} does not run in this runtime '
                        f"(`{binary} --version` exited {check.exit_code}: {scrub(said)[-300:] or '(no output)'})"
                        f"{libc}. Use an image it runs in (the default sandbox image does)")
    return binary, said.splitlines()[-1][:200]


async def keep_transcript(runtime: Runtime, info: dict[str, Any], hide: tuple[str, ...], tail_chars: int) -> str | None:
    """Take the driver's transcript out of the workspace (``TRANSCRIPT``) and remove it there.

    Puts its size and scrubbed tail on ``info`` (``transcript_bytes``, ``transcript_tail``) and returns
    the scrubbed text (its last ``TRANSCRIPT_MAX_BYTES``), or None when the driver left none.
    """
    try:
        raw = await runtime.read_file(TRANSCRIPT)
        await runtime.exec(f"rm -f {TRANSCRIPT}", timeout=60)
    except (FileNotFoundError, ValueError, RuntimeUnavailableError):   # none left (a killed launch), or no runtime
        return None
    text = scrub(raw[-TRANSCRIPT_MAX_BYTES:].decode("utf-8", "replace"), hide)
    info.update(transcript_bytes=len(raw), transcript_tail=text[-tail_chars:] if tail_chars else "")
    return text
