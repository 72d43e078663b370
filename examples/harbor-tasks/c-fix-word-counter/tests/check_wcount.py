"""Builds /app in a scratch copy and compares ./wcount with a reference on fresh inputs."""
import os, random, shutil, subprocess, sys, tempfile

def expect(data: bytes) -> str:
    lines = data.split(b"\n")
    nl = data.count(b"\n")
    return f"{nl} {len(data.split())} {len(data)} {max(len(x) for x in lines)}\n"

work = tempfile.mkdtemp()
src = os.path.join(work, "app")
shutil.copytree("/app", src, ignore=shutil.ignore_patterns("wcount", "*.o", ".git"))
r = subprocess.run(["make", "-C", src, "wcount"], capture_output=True, text=True, timeout=60)
if r.returncode != 0 or not os.path.exists(os.path.join(src, "wcount")):
    print("build failed:", r.stdout[-2000:], r.stderr[-2000:])
    sys.exit(1)
exe = os.path.join(src, "wcount")

rng = random.Random(os.urandom(8))
cases = [b"", b"\n", b"a", b"hello  world\n\tfoo", b"   \t\r\n  \n", b"one\ntwo\nthree\n", b"x" * 5000,
         b"word " * 2000 + b"\n" + b"y" * 300 + b"\n", b"\xff\xfe caf\xc3\xa9 \x00\x01 end\n", b"\v\fa\v\fb\r\n"]
for _ in range(25):
    n = rng.randint(0, 20000)
    alphabet = rng.choice([b"ab \n", b"abc  \t\n\r", bytes(range(256)), b"x\n", b"lorem ipsum dolor\n\n  "])
    cases.append(bytes(rng.choice(alphabet) for _ in range(n)))
fails = 0
for i, data in enumerate(cases):
    want = expect(data)
    path = os.path.join(work, f"in{i}.bin")
    with open(path, "wb") as f:
        f.write(data)
    for argv, stdin in (([exe, path], None), ([exe], data)):
        p = subprocess.run(argv, input=stdin, capture_output=True, timeout=10)
        got = p.stdout.decode(errors="replace")
        if p.returncode != 0 or got != want:
            fails += 1
            if fails <= 5:
                print(f"case {i} ({'file' if stdin is None else 'stdin'}, {len(data)} bytes): got {got!r} want {want!r}")
print(f"{fails} failures over {2 * len(cases)} runs")
sys.exit(1 if fails else 0)
