"""A command in a private view of a running container, out of reach of the container's other processes.

A Harbor task's tests run in the agent's box while the services the agent started still run (Harbor's
shared verifier mode), yet nothing the agent left may write the reward or change the tests. The box runs
with every capability dropped and ``no-new-privileges``, so nothing run in it can make a mount
namespace, and a privileged ``docker exec`` is no way out either: it needs every capability of the
engine, and an engine that lacks one (this machine's dockerd has no ``CAP_SYS_RESOURCE``) refuses it
("unable to apply caps"). So ``run_private``:

1. starts a **helper container** from the box's image, in the box's PID and network namespaces, as
   root with Docker's default capabilities plus ``CAP_SYS_ADMIN`` (to enter and make mount namespaces),
   ``no-new-privileges``, the box's cpu, memory and pids limits; the inputs (the tests) are put into
   the helper's own filesystem, which the box cannot see;
2. in it, ``nsenter`` (the helper's, from the pristine image) enters the box's mount namespace and
   ``unshare`` makes a private copy of it, where a fresh tmpfs over ``/dev/shm`` (a mount point in the
   box, which the box's processes cannot rename) becomes a new root: every top-level entry of the box
   bound into it (links copied as links), ``/dev/shm`` a fresh tmpfs again, and each private path a
   plain directory of that tmpfs (``/tests`` with the inputs copied in, ``/logs/verifier`` empty;
   ``/logs``' other entries bound from the box). So a process of the box that rewrites
   ``/logs/verifier/reward.txt`` in a loop, writes into ``/tests``, or renames ``/logs`` or ``/tests``
   writes only the box's own files, never these;
3. the command runs ``chroot``-ed there, in the workdir, with Docker's default capabilities
   (``setpriv`` drops ``CAP_SYS_ADMIN``), as Harbor's box has them; it sees the box's files and
   processes and reaches its services on loopback. A box process (no capabilities) cannot reach the
   command's files through ``/proc/<pid>/root`` or ``/proc/<pid>/fd``: the kernel's ptrace access
   check refuses a caller whose permitted capabilities lack the target's. It can still signal the
   command (both are uid 0): a killed test writes no reward, which is an error, never a score;
4. the regular files the command left in the collected directory (at most ``MAX_FILES``, each its
   last ``keep_bytes`` and its size) are copied to the helper's filesystem and read from there, and
   the helper is removed (also on cancellation).

The box's image needs ``nsenter``, ``unshare``, ``mount`` and ``setpriv`` (util-linux; Debian and Ubuntu
images have them), ``chroot``, ``timeout`` and ``tail`` (coreutils): without one the command is not run
and ``TaskError`` names it. Measured here (2026-12-05): the helper starts in about 0.1 s and the whole
run costs about 1 s more than an ``exec``. Must not import Prefect; the functions block (call them in a thread).
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import time
from pathlib import Path
from typing import Any

from prefect_rollouts.errors import TaskError

DEFAULT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
                        "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE")
"""Docker's default capability set (moby ``oci/caps/defaults.go``): what a command run by ``run_private`` has."""
HOME = "/prefect-rollouts-private"
"""The helper's directory of inputs (``in/``) and collected files (``out/``), in its own filesystem."""
MAX_FILES = 50
"""At most this many files of the collected directory are read back."""
SLACK_S = 60.0
"""Seconds past the command's deadline allowed for setting up and collecting before the helper is killed."""
MISSING = 127
"""The script's exit code when a tool it needs is missing (its stderr names it)."""

# Three shells, each handing the next its script and the arguments: _OUTER in the helper (its /proc/<pid>/root is
# the helper's filesystem, where the inputs are and the outputs go, so it stays while the others run), _INNER in
# the box's mount namespace, _PRIVATE in a private copy of it. Arguments after the scripts and the outer deadline:
# seconds, workdir, command, collected path, bytes kept per file, size of the private root in MiB, private paths.
_OUTER = r"""inner=$1 private=$2 deadline=$3; shift 3
for tool in nsenter timeout; do
  command -v "$tool" >/dev/null 2>&1 || { echo "missing: $tool" >&2; exit 127; }
done
timeout -s KILL "$deadline" nsenter -t 1 -m -- sh -c "$inner" sh "$$" "$private" "$@"
"""

_INNER = r"""h=/proc/$1/root/prefect-rollouts-private private=$2; shift 2
limit=$1 workdir=$2 command=$3 collect=$4 keep=$5 size=$6; shift 6
for tool in unshare mount setpriv chroot timeout tail; do
  command -v "$tool" >/dev/null 2>&1 || { echo "missing: $tool" >&2; exit 127; }
done
exec unshare -m --propagation private -- sh -c "$private" sh "$h" "$limit" "$workdir" "$command" "$collect" \
  "$keep" "$size" "$@"
"""

_PRIVATE = r"""set -e
h=$1 limit=$2 workdir=$3 command=$4 collect=$5 keep=$6 size=$7; shift 7
r=/dev/shm
mount -t tmpfs -o mode=0755,size=${size}m prefect-rollouts-private "$r"
mirror() {   # bind every entry of $1 into $2 but the names in $3 (links copied as links)
  for e in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    n=${e##*/}
    case " $3 " in *" $n "*) continue ;; esac
    if [ -L "$e" ]; then ln -s "$(readlink "$e")" "$2/$n"
    elif [ -d "$e" ]; then mkdir "$2/$n"; mount --rbind "$e" "$2/$n"
    else : > "$2/$n"; mount --bind "$e" "$2/$n"; fi
  done
}
tops="" nested=""
for p in "$@"; do
  top=${p#/}; top=${top%%/*}
  tops="$tops $top"
  [ "/$top" = "$p" ] || nested="$nested $p"
done
mirror "" "$r" "$tops"
[ -d "$r/dev/shm" ] && mount -t tmpfs -o mode=1777,size=64m shm "$r/dev/shm"
for p in "$@"; do
  top=${p#/}; top=${top%%/*}
  [ -d "$r/$top" ] && continue
  mkdir -p "$r/$top"
  skip=""
  for q in $nested; do
    case "$q" in "/$top/"*) rest=${q#/$top/}; skip="$skip ${rest%%/*}" ;; esac
  done
  [ "/$top" = "$p" ] || { [ -d "/$top" ] && mirror "/$top" "$r/$top" "$skip"; }
done
for p in "$@"; do mkdir -p "$r$p"; done
cp -R "$h/in/." "$r/"
set +e
timeout -s KILL "$limit" chroot "$r" setpriv --bounding-set -sys_admin --inh-caps -all -- \
  sh -c 'cd "$1" 2>/dev/null || cd /; exec bash -c "$2"' sh "$workdir" "$command" </dev/null >/dev/null 2>&1
code=$?
mkdir -p "$h/out/files" "$h/out/sizes"
echo "$code" > "$h/out/exit"
count=0
for f in "$r$collect"/* "$r$collect"/.[!.]* "$r$collect"/..?*; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  count=$((count + 1)); [ "$count" -le MAX_FILES ] || break
  n=${f##*/}
  tail -c "$keep" "$f" > "$h/out/files/$n"
  wc -c < "$f" > "$h/out/sizes/$n"
done
exit 0
""".replace("MAX_FILES", str(MAX_FILES))


def run_private(client: Any, container_id: str, create_options: dict[str, Any], *, image: str, command: str,
                environment: dict[str, str], workdir: str, inputs: dict[str, Path], private: list[str],
                collect: str, keep_bytes: int, size_mb: int, timeout_s: float,
                labels: dict[str, str]) -> tuple[int, bool, float, dict[str, tuple[int, bytes]]]:
    """Run ``command`` (``bash -c``) in a private view of container ``container_id`` (see the module docstring).

    Args:
        client: A ``docker.DockerClient``.
        container_id: The running box.
        create_options: Its resource options (``docker_limits.create_options``), given to the helper.
        image: The box's image (the helper runs it).
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

    Returns:
        ``(exit_code, timed_out, seconds, files)``: ``files`` maps a file's name to ``(size in bytes,
        its last keep_bytes)``.

    Raises:
        TaskError: a tool the private view needs is missing from the image (named), or the view could not
            be made (the script's stderr).
    """
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for directory in ("", "/in", "/out"):
            entry = tarfile.TarInfo(HOME.lstrip("/") + directory)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o700
            tar.addfile(entry)
        for inside, source in inputs.items():
            tar.add(str(source), arcname=posixpath.join(HOME.lstrip("/"), "in", inside.lstrip("/")))
    helper = client.containers.create(   # created, then started inside the try: a failed start removes it too
        image, ["infinity"], entrypoint=["sleep"], user="0:0", labels=labels,
        pid_mode=f"container:{container_id}", network_mode=f"container:{container_id}",
        cap_drop=["ALL"], cap_add=[*DEFAULT_CAPABILITIES, "SYS_ADMIN"], security_opt=["no-new-privileges"],
        **create_options)
    try:
        helper.start()
        api = client.api
        api.put_archive(helper.id, "/", archive.getvalue())
        argv = ["sh", "-c", _OUTER, "sh", _INNER, _PRIVATE, f"{timeout_s + SLACK_S:.3f}", f"{timeout_s:.3f}", workdir,
                command, collect, str(keep_bytes), str(size_mb), *private]
        started = time.monotonic()
        exec_id = api.exec_create(helper.id, argv, user="0:0", workdir="/", environment=environment)["Id"]
        stderr = api.exec_start(exec_id, demux=True)[1] or b""
        seconds = time.monotonic() - started
        code = api.exec_inspect(exec_id)["ExitCode"]
        if code != 0:
            text = stderr.decode(errors="replace").strip()
            if code == MISSING and text.startswith("missing: "):
                raise TaskError(f"the box's image lacks {text[len('missing: '):].splitlines()[0]}, which running the "
                                "tests apart from the agent's processes needs (util-linux, coreutils). Install it "
                                "in the image")
            raise TaskError(f"cannot make the private view of the box to run the tests in (exit {code}): "
                            f"{text[-500:] or '(no output)'}")
        stream, _ = api.get_archive(helper.id, f"{HOME}/out")
        return _read_out(b"".join(stream), seconds, timeout_s)
    finally:
        helper.remove(force=True)


def _read_out(data: bytes, seconds: float, timeout_s: float) -> tuple[int, bool, float, dict[str, tuple[int, bytes]]]:
    """``run_private``'s result from the archive of the helper's ``out/`` directory."""
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            if member.isfile():
                handle = tar.extractfile(member)
                members[member.name] = handle.read() if handle is not None else b""
    code = int(members.get("out/exit", b"-1").strip() or -1)
    files: dict[str, tuple[int, bytes]] = {}
    for name, content in members.items():
        if name.startswith("out/files/"):
            size = members.get("out/sizes/" + name[len("out/files/"):], b"").strip()
            files[name[len("out/files/"):]] = (int(size) if size.isdigit() else len(content), content)
    timed_out = code in (124, 137) and seconds >= timeout_s
    return code, timed_out, seconds, files

