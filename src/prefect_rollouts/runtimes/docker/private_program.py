"""The program ``private.run_private`` runs in its helper container (by the sandbox image's ``python3``), as
text: it enters the box's mount namespace, makes the private view, drops the capabilities and runs the command.
Kept apart from the code that drives it, which reads as Python; this reads as what runs inside. Must not import
Prefect."""

MAX_FILES = 50
"""At most this many files of the collected directory are read back."""

# Run by the sandbox image's python3 in the helper: argv = deadline seconds, workdir, command, collected path,
# bytes kept per file, size of the private root in MiB, the user ("": root), then the private paths. Everything
# it needs is imported and every helper file it uses opened before it enters the box's mount namespace: from
# then on it runs no program and imports no module of the box's while it holds CAP_SYS_ADMIN (a box binary
# replaced by the agent would get it; the user is looked up by reading the box's files as text, not through
# NSS, which would load the box's libraries); the command's bash is the first, after the capability is gone.
PROGRAM = r"""
import ctypes, os, signal, stat, sys, time
limit, workdir, command, collect, keep, size_mb, user = sys.argv[1:8]
private, limit, keep = sys.argv[8:], float(limit), int(keep)
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong)
MS_BIND, MS_REC, MS_PRIVATE, CLONE_NEWNS, PR_CAPBSET_DROP, CAP_SYS_ADMIN = 4096, 16384, 1 << 18, 0x20000, 24, 21
CAP_SYS_PTRACE, CAP_MKNOD, PR_SET_KEEPCAPS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 19, 27, 8, 47, 2

class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

def keep_mknod():   # after setuid: MKNOD in the permitted, inheritable and ambient sets, so it survives exec
    data = (CapData * 2)()
    data[0].effective = data[0].permitted = data[0].inheritable = 1 << CAP_MKNOD
    check(libc.capset(ctypes.byref(CapHeader(0x20080522, 0)), data), "keep CAP_MKNOD")
    check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_MKNOD, 0, 0), "keep CAP_MKNOD across exec")

def check(result, what):
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, what + ": " + os.strerror(number))

def mount(source, target, kind, flags, data=None):
    check(libc.mount(source and source.encode(), target.encode(), kind and kind.encode(), flags,
                     data and data.encode()), "mount " + target)

def mirror(source, target, skip):   # bind every entry of source into target but those in skip (links as links)
    for name in os.listdir(source):
        if name in skip:
            continue
        path, place = source.rstrip("/") + "/" + name, target + "/" + name
        try:   # an entry the box's processes change meanwhile may fail: none of them is the command's
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                os.symlink(os.readlink(path), place)
            elif stat.S_ISDIR(mode):
                os.mkdir(place)
                mount(path, place, None, MS_BIND | MS_REC)
            else:
                os.close(os.open(place, os.O_CREAT | os.O_WRONLY, 0o600))
                mount(path, place, None, MS_BIND)
        except OSError:
            pass

def copy(source_fd, target):   # the inputs, from the helper's filesystem
    for entry in os.scandir(source_fd):
        place, info = target + "/" + entry.name, entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(entry.name, dir_fd=source_fd), place)
        elif stat.S_ISDIR(info.st_mode):
            os.makedirs(place, exist_ok=True)   # a private path made already, or a directory of the inputs
            inner = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=source_fd)
            copy(inner, place)
            os.close(inner)
        elif stat.S_ISREG(info.st_mode):
            reading = os.open(entry.name, os.O_RDONLY, dir_fd=source_fd)
            writing = os.open(place, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            while chunk := os.read(reading, 1 << 20):
                os.write(writing, chunk)
            os.close(reading)
            os.close(writing)
        if not stat.S_ISLNK(info.st_mode):
            os.chmod(place, stat.S_IMODE(info.st_mode))

# The helper's seccomp profile is Docker's default with CAP_SYS_ADMIN, which lets anyone in it make namespaces
# (a user namespace needs no capability); the command gets the default profile's refusals back: unshare, setns,
# a clone with namespace flags, perf_event_open and bpf fail with EPERM, clone3 with ENOSYS (glibc falls back).
ARCHES = {0xC000003E: (272, 308, 56, 435, 298, 321), 0xC00000B7: (97, 268, 220, 435, 241, 280)}   # x86_64, arm64

def refuse_as_docker_does():
    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]
    load, equal, test, ret, allow = 0x20, 0x15, 0x45, 0x06, 0x7FFF0000
    refuse, missing = 0x00050000 | 1, 0x00050000 | 38
    code = [(load, 0, 0, 4)]
    for arch, (unshare, setns, clone, clone3, perf, bpf) in ARCHES.items():
        block = [(load, 0, 0, 0)]
        for number, action in ((unshare, refuse), (setns, refuse), (clone3, missing), (perf, refuse), (bpf, refuse)):
            block += [(equal, 0, 1, number), (ret, 0, 0, action)]
        block += [(equal, 0, 3, clone), (load, 0, 0, 16), (test, 0, 1, 0x7E020000), (ret, 0, 0, refuse),
                  (ret, 0, 0, allow)]
        code += [(equal, 0, len(block), arch), *block]
    code.append((ret, 0, 0, allow))
    table = (Filter * len(code))(*[Filter(*line) for line in code])
    program = Program(len(code), table)
    check(libc.prctl(22, 2, ctypes.byref(program), 0, 0), "install the seccomp filter")   # SECCOMP_MODE_FILTER

def entry_of(path, key):   # the line of the box's /etc/passwd or /etc/group for a name or number (read as text: no NSS)
    try:
        with open(path, errors="replace") as lines:
            for line in lines:
                fields = line.rstrip("\n").split(":")
                if len(fields) >= 4 and key in (fields[0], fields[2]):
                    return fields
    except OSError:
        pass
    return None

def become(user):   # Docker's --user: name or uid, then :group or :gid; a number missing from the files is fine
    name, _, group = user.partition(":")
    found = entry_of("/etc/passwd", name)
    if found is None and not name.isdigit():
        raise OSError("no user %r in the box's /etc/passwd" % name)
    uid = int(found[2]) if found else int(name)
    gid = int(found[3]) if found else uid
    if group:
        grouped = entry_of("/etc/group", group)
        if grouped is None and not group.isdigit():
            raise OSError("no group %r in the box's /etc/group" % group)
        gid = int(grouped[2]) if grouped else int(group)
    for path in private:   # the command's own directories (the tests, their logs) become the user's
        for top, directories, files in os.walk(path):
            for name in [top, *(os.path.join(top, entry) for entry in directories + files)]:
                os.lchown(name, uid, gid)
    os.setgroups([])
    os.setgid(gid)
    check(libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "keep capabilities through setuid")
    os.setuid(uid)
    if uid != 0:   # a capability no box process has (BOX_CAPABILITIES): the ptrace check keeps them out
        keep_mknod()
    if found:
        os.environ["HOME"], os.environ["USER"] = found[5] if len(found) > 5 else "/", found[0]

def write(directory, name, data):
    handle = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=directory)
    os.write(handle, data)
    os.close(handle)

try:
    home = os.open("/prefect-rollouts-private", os.O_RDONLY | os.O_DIRECTORY)
    inputs = os.open("in", os.O_RDONLY | os.O_DIRECTORY, dir_fd=home)
    outputs = os.open("out", os.O_RDONLY | os.O_DIRECTORY, dir_fd=home)
    null = os.open("/dev/null", os.O_RDWR)
    check(libc.setns(os.open("/proc/1/ns/mnt", os.O_RDONLY), CLONE_NEWNS), "enter the box's mount namespace")
    check(libc.unshare(CLONE_NEWNS), "unshare the mount namespace")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = "/dev/shm"   # a mount point of the box: no process of it can rename it, or /dev
    mount("prefect-rollouts-private", root, "tmpfs", 0, "mode=0755,size=" + size_mb + "m")
    tops = {path.strip("/").split("/")[0] for path in private}
    mirror("/", root, tops)
    if os.path.isdir(root + "/dev/shm"):
        mount("shm", root + "/dev/shm", "tmpfs", 0, "mode=1777,size=64m")
    for top in sorted(tops):
        os.mkdir(root + "/" + top)
        inner = {path.strip("/").split("/")[1] for path in private if path.strip("/").split("/")[0] == top
                 and "/" in path.strip("/")}
        if inner and os.path.isdir("/" + top):
            mirror("/" + top, root + "/" + top, inner)
    for path in private:
        os.makedirs(root + path, exist_ok=True)
    copy(inputs, root)
except OSError as exc:
    os.write(2, ("cannot make the private view: " + str(exc)).encode())
    os._exit(3)
started = time.monotonic()
pid = os.fork()
if pid == 0:
    try:
        os.setsid()
        for number in (0, 1, 2):
            os.dup2(null, number)
        os.chroot(root)
        try:
            os.chdir(workdir)
        except OSError:
            os.chdir("/")
        check(libc.prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0), "drop CAP_SYS_ADMIN")
        check(libc.prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0), "drop CAP_SYS_PTRACE")
        refuse_as_docker_does()
        if user:
            become(user)
        os.execvp("bash", ["bash", "-c", command])
    finally:
        os._exit(127)
timed_out = False
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        code = os.waitstatus_to_exitcode(status)
        break
    if time.monotonic() - started >= limit:
        timed_out = True
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(pid, 0)
        code = -9
        break
    time.sleep(0.02)
seconds = time.monotonic() - started
write(outputs, "result", ("%d %d %.3f" % (code, timed_out, seconds)).encode())
os.mkdir("files", dir_fd=outputs)
kept = os.open("files", os.O_RDONLY | os.O_DIRECTORY, dir_fd=outputs)
sizes = []
try:
    collected = os.open(root + collect, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    names = sorted(os.listdir(collected))
except OSError:
    names = []
for name in names:
    if len(sizes) >= MAX_FILES:
        break
    try:
        handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=collected)
    except OSError:   # a symlink, or gone
        continue
    info = os.fstat(handle)
    if stat.S_ISREG(info.st_mode):
        os.lseek(handle, max(0, info.st_size - keep), os.SEEK_SET)
        write(kept, name, os.read(handle, keep))
        sizes.append(name.encode(errors="surrogateescape") + b"\0" + str(info.st_size).encode() + b"\0")
    os.close(handle)
write(outputs, "sizes", b"".join(sizes))
""".replace("MAX_FILES", str(MAX_FILES))
