"""Launch an agent program inside a runtime, wired to the interception endpoint (stdlib, Python >= 3.8).

    python3 launch.py SOCKET TAIL_CHARS [--sweep] [--state DIR] -- ARGV...

Run by the program harness in the runtime's workspace, with ``OPENAI_API_KEY`` (the launch's
secret) and ``OPENAI_MODEL`` set. It

1. fetches the turn's prompt from the endpoint (``GET /prefect-rollouts/session`` over the Unix
   socket ``SOCKET``) and writes it to ``PROMPT_FILE`` (and ``SYSTEM_PROMPT_FILE`` when the task has
   a system prompt) in its private directory: ``DIR`` (made here, mode 700), else a temporary one;
2. listens on ``127.0.0.1:<free port>`` and relays each connection to ``SOCKET``, bringing the
   loopback interface up first when a fresh network namespace left it down, and sets
   ``OPENAI_BASE_URL=http://127.0.0.1:<port>/v1`` (chat completions, Responses),
   ``ANTHROPIC_BASE_URL=http://127.0.0.1:<port>`` (Messages, under ``/v1/messages``), and
   ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_AUTH_TOKEN`` to the launch's key;
3. runs ``ARGV`` (in this process group, so a group kill reaches it), keeps the last ``TAIL_CHARS``
   characters of its stdout and stderr, prints them at its exit, and exits with its code
   (127 when ``ARGV[0]`` cannot be run); meanwhile it keeps them in ``DIR/tails.json`` too
   (``{"stdout_tail", "stderr_tail", "stdout_bytes", "stderr_bytes"}``, replaced by a rename when
   output arrives, at most every ``SAVE_S``, and at the exit), which the harness reads when it had
   to kill this launcher (the agent deadline): what the program printed is not lost with it;
4. when the program exits, stops relaying, ends the session at the endpoint (its key is refused
   from then on, whatever the program left running) and removes its private directory; and while
   it runs, kills it (the process group; with ``--sweep``, in a container, every process but init
   and the keep-alive) once the endpoint stops answering: its agent was killed.
"""

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def call(path, method, target, secret):
    """``(status, body bytes)`` of a bare HTTP/1.0 request to the endpoint over the Unix socket ``path``
    (the server closes the connection after the response). Not ``http.client``: importing it (ssl,
    the email parser) cost this launcher most of its start-up CPU."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(30)
        connection.connect(path)
        connection.sendall((f"{method} {target} HTTP/1.0\r\nHost: localhost\r\nContent-Length: 0\r\n"
                            f"Authorization: Bearer {secret}\r\n\r\n").encode("latin-1"))
        chunks = []
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    head, _, data = b"".join(chunks).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    return (int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0), data


def fetch_session(path, secret):
    """The turn's session (``GET /prefect-rollouts/session``)."""
    status, data = call(path, "GET", "/prefect-rollouts/session", secret)
    if status != 200:
        shown = data[:300].decode("utf-8", "replace")
        sys.exit(f"launch: the interception endpoint refused this launch (HTTP {status}): {shown}")
    return json.loads(data)


def end_session(path, secret):
    """Tell the endpoint the program exited (``POST /prefect-rollouts/session/end``): from now on it
    refuses this launch's key, so a process the program left behind cannot add model calls."""
    try:
        call(path, "POST", "/prefect-rollouts/session/end", secret)
    except OSError:
        pass   # the endpoint is gone: nothing can reach it anyway


def watch(path, sweep):
    """Kill the program when the endpoint stops answering twice in a row, ``WATCH_S`` apart: its
    agent died (``kill -9``), and in a container nothing else would end the program (or what it
    started) until the janitor removes the container. ``sweep``: this is a container's PID
    namespace, so kill every process in it but init and the keep-alive (``sweep_container``);
    else this process group only (the local runtime ends the rest with its owner)."""
    misses = 0
    while True:
        time.sleep(WATCH_S)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(5)
                probe.connect(path)
            misses = 0
        except (FileNotFoundError, ConnectionRefusedError):
            misses += 1
        except OSError:
            misses = 0
        if misses >= 2:
            sys.stderr.write("launch: the interception endpoint is gone (its agent exited): killing the program\n")
            sys.stderr.flush()
            if sweep:
                sweep_container()
            os.killpg(os.getpgid(0), signal.SIGKILL)


def sweep_container():
    """SIGKILL every process of this PID namespace except PID 1, the keep-alive ``sleep infinity``
    (a child of PID 1) and this one; as the docker runtime's ``kill_all`` does from outside."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{name}/cmdline", "rb") as handle:
                    stats[int(name)] = (ppid, handle.read())
            except (OSError, ValueError, IndexError):
                continue
    keep = {1, os.getpid()}
    keep.update(sorted(pid for pid, (ppid, cmdline) in stats.items()
                       if ppid == 1 and cmdline == b"sleep\0infinity\0")[:1])
    for pid in stats:
        if pid not in keep:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


WATCH_S = 2.0


def loopback_up():
    """Set ``lo`` up when it is down (a fresh network namespace starts so: binding works, connecting not)."""
    import fcntl
    import struct
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            request = struct.pack("16sH14s", b"lo", 0, b"")
            flags = struct.unpack("16sH14s", fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, request))[1]
            if not flags & IFF_UP:
                fcntl.ioctl(probe.fileno(), SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))
    except OSError as exc:   # no CAP_NET_ADMIN here: the program will say it cannot connect
        sys.stderr.write(f"launch: cannot bring the loopback interface up: {exc}\n")


def listen():
    loopback_up()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    return listener


MAX_RELAYED = 24
"""Connections relayed at once: one more is closed at once, so a program opening thousands costs
neither threads here nor descriptors at the endpoint. Below the endpoint's per-rollout cap (32), so
connections the program just closed, which the endpoint sees close a moment later, leave room."""


def pump(source, target, done):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, target):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        done()


def finish(pumps, ends, slots):
    """A pump between ``ends`` ended: the second one (``pumps`` counts them down; ``list.pop`` is atomic)
    closes both sockets and frees their slot."""
    pumps.pop()
    if not pumps:
        for end in ends:
            end.close()
        slots.release()


def relay(listener, path):
    slots = threading.BoundedSemaphore(MAX_RELAYED)
    while True:
        try:
            client, _ = listener.accept()
        except OSError:   # closed when the program exited
            return
        if not slots.acquire(blocking=False):
            client.close()
            continue
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            slots.release()
            continue
        done = functools.partial(finish, [1, 2], (client, upstream), slots)
        for started, (source, target) in enumerate(((client, upstream), (upstream, client))):
            try:
                threading.Thread(target=pump, args=(source, target, done), daemon=True).start()
            except RuntimeError:   # no thread to be had (the process limit, a fork bomb's): refuse it, go on
                for end in (client, upstream):
                    try:
                        end.shutdown(socket.SHUT_RDWR)   # ends the pump that started, which does its done()
                    except OSError:
                        pass
                for _ in range(2 - started):
                    done()
                break


def tail(fd, keep, counts, index, changed):
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            os.close(fd)
            return
        counts[index] += len(chunk)
        keep[index] = (keep[index] + chunk)[-LIMIT[0]:] if LIMIT[0] else b""
        changed.set()   # the saver writes it out: nothing slower here


LIMIT = [0]


def texts(keep):
    """The kept stdout and stderr as text, each cut to ``TAIL_CHARS`` characters."""
    limit = LIMIT[0] // 4
    return [data.decode("utf-8", "replace")[-limit:] if limit else "" for data in keep]


def save(path, keep, counts):
    """Write the tails so far to ``path`` (a temporary file renamed over it: a reader never sees half
    of one); a failed write (the program filled the disk, or took the directory) is skipped."""
    out, err = texts(keep)
    data = json.dumps({"stdout_tail": out, "stderr_tail": err, "stdout_bytes": counts[0],
                       "stderr_bytes": counts[1]}, ensure_ascii=False).encode("utf-8")
    try:
        with open(path + ".tmp", "wb") as handle:
            handle.write(data)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def keep_saving(path, keep, counts, changed, lock, done):
    """Rewrite ``path`` when the program's output changed (``changed`` set), at once and then at most
    every ``SAVE_S`` seconds, until ``done`` is set; ``lock`` keeps the last write (``main``'s) the last."""
    while True:
        changed.wait()
        changed.clear()
        with lock:
            if done.is_set():
                return
            save(path, keep, counts)
        time.sleep(SAVE_S)


SAVE_S = 0.5
TAILS_FILE = "tails.json"
PRIVATE_FILES = ("prompt.txt", "system_prompt.txt", TAILS_FILE, TAILS_FILE + ".tmp")


def private_directory(wanted):
    """``wanted`` made (mode 700, its parents as needed), else a fresh temporary directory (the tails
    are then not where the harness looks, and the launch runs all the same)."""
    if wanted:
        try:
            os.makedirs(os.path.dirname(wanted), exist_ok=True)
            os.mkdir(wanted, 0o700)
            return wanted
        except OSError:
            pass
    return tempfile.mkdtemp(prefix="prefect-rollouts-")


def remove_private(private):
    """Remove the private directory's files and the directory (not ``shutil``: its import costs start-up)."""
    for name in PRIVATE_FILES:
        try:
            os.unlink(os.path.join(private, name))
        except OSError:
            pass
    try:
        os.rmdir(private)
    except OSError:
        pass   # the program left something there


def main(argv):
    split = argv.index("--") if "--" in argv else -1
    options = argv[2:split]
    sweep = "--sweep" in options
    wanted = options[options.index("--state") + 1] if "--state" in options[:-1] else None
    if split < 2 or split == len(argv) - 1 or set(options) - {"--sweep", "--state", wanted}:
        sys.exit("usage: launch.py SOCKET TAIL_CHARS [--sweep] [--state DIR] -- ARGV...")
    path, LIMIT[0], command = argv[0], int(argv[1]) * 4, argv[split + 1:]
    secret = os.environ.get("OPENAI_API_KEY", "")
    session = fetch_session(path, secret)
    private = private_directory(wanted)
    try:
        return run(path, secret, session, private, sweep, command)
    finally:
        remove_private(private)


def run(path, secret, session, private, sweep, command):
    env = dict(os.environ)
    env["PROMPT_FILE"] = os.path.join(private, "prompt.txt")
    with open(env["PROMPT_FILE"], "w", encoding="utf-8") as handle:
        handle.write(session["prompt"])
    if session.get("system_prompt"):
        env["SYSTEM_PROMPT_FILE"] = os.path.join(private, "system_prompt.txt")
        with open(env["SYSTEM_PROMPT_FILE"], "w", encoding="utf-8") as handle:
            handle.write(session["system_prompt"])
    listener = listen()
    root = f"http://127.0.0.1:{listener.getsockname()[1]}"
    env["OPENAI_BASE_URL"] = root + "/v1"   # chat completions and Responses
    env["ANTHROPIC_BASE_URL"] = root        # Messages: the Anthropic SDKs add /v1/messages
    env["ANTHROPIC_API_KEY"] = env["ANTHROPIC_AUTH_TOKEN"] = secret   # x-api-key, Authorization: Bearer
    env.setdefault("OPENAI_MODEL", session.get("model") or "")
    threading.Thread(target=relay, args=(listener, path), daemon=True).start()
    # Every thread starts before the program: a program that fills the process limit (a fork bomb;
    # threads count) would leave none to start, and this launcher would die without its report.
    keep, counts, pipes, changed = [b"", b""], [0, 0], [os.pipe(), os.pipe()], threading.Event()
    readers = [threading.Thread(target=tail, args=(pipe[0], keep, counts, index, changed), daemon=True)
               for index, pipe in enumerate(pipes)]
    for reader in readers:
        reader.start()
    threading.Thread(target=watch, args=(path, sweep), daemon=True).start()
    tails, lock, done = os.path.join(private, TAILS_FILE), threading.Lock(), threading.Event()
    save(tails, keep, counts)   # there from the start: a launch killed before any output printed nothing
    threading.Thread(target=keep_saving, args=(tails, keep, counts, changed, lock, done), daemon=True).start()
    try:
        process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=pipes[0][1], stderr=pipes[1][1])
    except OSError as exc:
        sys.stderr.write(f"launch: cannot run {command[0]!r}: {exc}\n")
        done.set()
        changed.set()
        return 127
    finally:
        for _, write_end in pipes:
            os.close(write_end)
    code = process.wait()
    listener.close()
    end_session(path, secret)
    deadline = time.monotonic() + 1.0   # a process the program left behind may hold its pipes open
    for reader in readers:
        reader.join(timeout=max(0.0, deadline - time.monotonic()))
    with lock:
        done.set()
        if changed.is_set():
            save(tails, keep, counts)
        changed.set()   # the saver wakes to see done
    out, err = texts(keep)
    sys.stdout.write(out)
    sys.stderr.write(err)
    sys.stderr.write(f"\n[launch] exit={code} stdout_bytes={counts[0]} stderr_bytes={counts[1]}\n")
    sys.stdout.flush()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
