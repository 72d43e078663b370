"""A command in a private view of a running container, out of reach of the container's other processes.

A Harbor task's tests run in the agent's box while the services the agent started still run (Harbor's
shared verifier mode), yet nothing the agent left may write the reward or change the tests. The box runs
with every capability dropped and ``no-new-privileges``, so nothing run in it can make a mount
namespace, and a privileged ``docker exec`` is no way out either: it asks for every capability of the
engine, and an engine without one refuses it (this machine's dockerd lacks ``CAP_SYS_RESOURCE``: "unable
to apply caps"). So ``run_private``:

1. starts a **helper container** of the sandbox image (``runtimes/docker/sandbox.py``) in the box's PID and
   network namespaces, as root with Docker's default capabilities plus ``CAP_SYS_ADMIN``,
   ``no-new-privileges`` and the box's cpu, memory and pids limits; the inputs (the tests) are put
   into the helper's own filesystem, which the box cannot see;
2. in it, one Python program (``private_program.PROGRAM``, the sandbox's python3) opens what it needs of the helper,
   enters the box's mount namespace, makes a private copy of it, and mounts a fresh tmpfs over
   ``/dev/shm`` (a mount point of the box, which no box process can rename) as a new root: every
   top-level entry of the box bound into it (links copied as links), ``/dev/shm`` a fresh tmpfs again,
   each private path a plain directory of that tmpfs (``/tests`` with the inputs copied in,
   ``/logs/verifier`` empty; ``/logs``' other entries bound from the box). It runs no program and
   imports no module of the box's while it holds ``CAP_SYS_ADMIN``: a box binary the agent replaced
   never gets it. A box process that rewrites ``/logs/verifier/reward.txt`` in a loop, writes into
   ``/tests``, or moves ``/logs`` or ``/tests`` aside changes only the box's own files, never these;
3. the command (the box's ``bash -c``) runs ``chroot``-ed there in the workdir with Docker's default
   capabilities (``CAP_SYS_ADMIN`` dropped from its bounding set) and a seccomp filter that refuses what
   Docker's default profile refuses a box without ``CAP_SYS_ADMIN`` (namespaces, ``perf_event_open``,
   ``bpf``), as Harbor's box has them: it sees the box's files and processes and reaches its services on
   loopback. A box process (no capabilities, or ``BOX_CAPABILITIES``: the default set less ``MKNOD``)
   cannot reach the command's files through ``/proc/<pid>/root`` or ``/proc/<pid>/fd``: the kernel's
   ptrace access check refuses a caller whose permitted capabilities lack the target's. It can still
   signal the command (both are uid 0): a killed test writes no reward, an error, never a score;
4. at the deadline the command's session is killed; then the regular files (not links) it left in the
   collected directory, at most ``MAX_FILES``, each its last ``keep_bytes`` and its size, are written
   to the helper's filesystem and read from there; the helper is removed (also when this fails).

The box needs only ``bash`` (as in Harbor) and ``/dev/shm``. Measured here (2026-12-05, 15 runs of a
trivial test): median 0.32 s against 0.11 s for a plain ``exec`` and a read of the reward, so 0.21 s more
per scored rollout (``benchmarks/harbor_private_tests.py``). Must not import Prefect; the functions block
(call them in a thread).
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import time
from pathlib import Path
from typing import Any

import docker
import docker.errors

from prefect_rollouts.errors import RuntimeUnavailableError, TaskError
from prefect_rollouts.runtimes.docker.private_program import PROGRAM
from prefect_rollouts.runtimes.docker.sandbox import DEFAULT_IMAGE as SANDBOX_IMAGE

DEFAULT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
                        "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE")
"""Docker's default capability set (moby ``oci/caps/defaults.go``): what a command run by ``run_private`` has."""
BOX_CAPABILITIES = tuple(name for name in DEFAULT_CAPABILITIES if name != "MKNOD")
"""A box's capabilities under ``capabilities = "docker-default"``: the default set but one, so that a box
process never holds every capability of the private command (the ptrace check of step 3 needs one missing)."""
HOME = "/prefect-rollouts-private"
"""The helper's directory of inputs (``in/``) and collected files (``out/``), in its own filesystem."""
POLL_S = 0.1
"""How often the command's end is asked for (``exec_inspect``), seconds."""
SLACK_S = 60.0
"""Seconds past the command's deadline allowed for setting up and collecting before the helper is killed."""



def run_private(client: Any, container_id: str, create_options: dict[str, Any], *, command: str,
                environment: dict[str, str], workdir: str, inputs: dict[str, Path], private: list[str],
                collect: str, keep_bytes: int, size_mb: int, timeout_s: float, labels: dict[str, str],
                user: str = "") -> tuple[int, bool, float, dict[str, tuple[int, bytes]]]:
    """Run ``command`` (``bash -c``) in a private view of container ``container_id`` (see the module docstring).

    Args:
        client: A ``docker.DockerClient``.
        container_id: The running box.
        create_options: Its resource options (``docker_limits.create_options``), given to the helper.
        command: A ``bash -c`` command.
        environment: The command's environment.
        workdir: Where it starts (``/`` when the workdir is missing).
        inputs: Private path (absolute, e.g. ``/tests``) -> host directory copied into it.
        private: The private paths (``/tests``, ``/logs/verifier``): absolute, at most two levels deep.
        collect: The private path whose top-level regular files are read back after the command.
        keep_bytes: Bytes kept of each such file: its end.
        size_mb: Size of the private tmpfs, in MiB (inputs and what the command writes there; memory,
            counted against the helper's ``memory_mb``).
        timeout_s: The command's deadline (it is killed, ``SIGKILL``, at it).
        labels: The helper's labels (the box's, so the janitor finds a leftover).
        user: Who runs the command, as Docker's ``--user`` takes it (``name``, ``uid``, ``name:group``,
            ``uid:gid``; names from the box's ``/etc/passwd`` and ``/etc/group``, read as text); ``""``: root.
            The private paths (and what was copied into them) are that user's.
            A user other than root runs it with ``CAP_MKNOD`` alone (ambient, so its children keep it): no box
            process has it (``BOX_CAPABILITIES``), so the ptrace check keeps them out of the command's files
            even after one becomes that user (a root agent has ``CAP_SETUID``).

    Returns:
        ``(exit_code, timed_out, seconds, files)``: ``files`` maps a file's name to ``(size in bytes,
        its last keep_bytes)``.

    Raises:
        TaskError: the view could not be made (the program's stderr; e.g. the box lacks ``/dev/shm``), or it
            was still running ``2 * SLACK_S`` past ``timeout_s`` (a box process stopped it: the helper is removed
            from this side, since everything in it can be signalled by the box's root).
        RuntimeUnavailableError: the sandbox image is missing (not retryable); the engine failed.
    """
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for directory in ("", "/in", "/out"):
            entry = tarfile.TarInfo(HOME.lstrip("/") + directory)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o700
            tar.addfile(entry)
        for inside, source in inputs.items():
            tar.add(str(source), arcname=posixpath.join(HOME.lstrip("/"), "in", inside.lstrip("/")))
    try:   # created, then started inside the try below: a failed start removes it too
        helper = client.containers.create(
            SANDBOX_IMAGE, ["infinity"], entrypoint=["sleep"], user="0:0", labels=labels,
            pid_mode=f"container:{container_id}", network_mode=f"container:{container_id}",
            cap_drop=["ALL"], cap_add=[*DEFAULT_CAPABILITIES, "SYS_ADMIN", "SYS_PTRACE"],
            security_opt=["no-new-privileges"],
            **create_options)
    except docker.errors.ImageNotFound:
        raise RuntimeUnavailableError(f"running the tests apart from the agent's processes needs the sandbox image "
                                      f"{SANDBOX_IMAGE}. Build it with `prefect-rollouts sandbox build`",
                                      retryable=False) from None
    try:
        helper.start()
        api = client.api
        api.put_archive(helper.id, "/", archive.getvalue())
        program = ["timeout", "-s", "KILL", f"{timeout_s + SLACK_S:.3f}", "python3", "-I", "-c", PROGRAM,
                   f"{timeout_s:.3f}", workdir, command, collect, str(keep_bytes), str(size_mb), user, *private]
        argv = ["sh", "-c", f'exec "$@" 2> {HOME}/stderr', "sh", *program]
        exec_id = api.exec_create(helper.id, argv, user="0:0", workdir="/", environment=environment)["Id"]
        # Waited for from here: the helper's processes live in the box's PID namespace, where the box's root can
        # stop them (SIGSTOP), and a stopped exec's output stream never ends; the finally removes the helper.
        api.exec_start(exec_id, detach=True)
        deadline = time.monotonic() + timeout_s + 2 * SLACK_S
        while (state := api.exec_inspect(exec_id))["Running"]:
            if time.monotonic() > deadline:
                raise TaskError(f"the tests ran {timeout_s + 2 * SLACK_S:g} s, past their deadline and its slack: a "
                                "process of the box stopped or held them (e.g. SIGSTOP); the helper was removed")
            time.sleep(POLL_S)
        code = state["ExitCode"]
        if code != 0:
            stream, _ = api.get_archive(helper.id, f"{HOME}/stderr")
            text = _read_member(b"".join(stream)).decode(errors="replace").strip()
            raise TaskError(f"cannot run the tests apart from the agent's processes (exit {code}): "
                            f"{text[-500:] or '(no output)'}")
        stream, _ = api.get_archive(helper.id, f"{HOME}/out")
        return _read_out(b"".join(stream))
    finally:
        helper.remove(force=True, v=True)   # v: anonymous volumes of the image's VOLUMEs


def _read_member(data: bytes) -> bytes:
    """The one file of an archive ``get_archive`` returned for a file."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.next()
        handle = tar.extractfile(member) if member is not None and member.isfile() else None
        return handle.read() if handle is not None else b""


def _read_out(data: bytes) -> tuple[int, bool, float, dict[str, tuple[int, bytes]]]:
    """``run_private``'s result from the archive of the helper's ``out/`` directory."""
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is not None:
                members[member.name] = handle.read()
    code, timed_out, seconds = members["out/result"].split()
    found = members.get("out/sizes", b"").split(b"\0")[:-1]   # name \0 size \0, each
    sizes = {name.decode(errors="surrogateescape"): int(size)
             for name, size in zip(found[0::2], found[1::2], strict=True)}
    files = {name: (size, members.get(f"out/files/{name}", b"")) for name, size in sizes.items()}
    return int(code), timed_out == b"1", float(seconds), files
