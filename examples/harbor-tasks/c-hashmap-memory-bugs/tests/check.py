"""Builds /app's sources with AddressSanitizer + UBSan and runs the hidden driver and wordfreq cases."""
import collections, os, random, re, shutil, subprocess, sys, tempfile

SAN = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-std=c99"]
ENV = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=86",
           LSAN_OPTIONS="exitcode=87", UBSAN_OPTIONS="halt_on_error=1:exitcode=88:print_stacktrace=1")
work = tempfile.mkdtemp()
for f in ("strmap.c", "strmap.h", "wordfreq.c"):
    if not os.path.isfile(f"/app/{f}"):
        print("missing /app/" + f)
        sys.exit(1)
    shutil.copy(f"/app/{f}", work)
shutil.copy("/tests/driver.c", work)
fails = []


def build(out, *srcs):
    r = subprocess.run(["gcc", *SAN, "-o", out, *srcs], cwd=work, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        print(f"build of {out} failed:\n{r.stderr[-3000:]}")
        sys.exit(1)


def sanitizer_trouble(stderr):
    return re.search(r"AddressSanitizer|LeakSanitizer|runtime error:", stderr)


build("driver", "driver.c", "strmap.c")
build("wordfreq", "wordfreq.c", "strmap.c")

r = subprocess.run(["./driver"], cwd=work, capture_output=True, text=True, timeout=30, env=ENV)
if r.returncode != 0 or "DRIVER OK" not in r.stdout or sanitizer_trouble(r.stderr):
    fails.append(f"driver: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-2500:]}")


def expected(data, n):
    counts = collections.Counter(w.lower() for w in re.findall(rb"[A-Za-z]+", data))
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return b"".join(b"%d %s\n" % (c, w) for w, c in top)


rng = random.Random(os.urandom(8))
letters = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
cases = [(b"", 10), (b"The cat and the hat.\nTHE END", 10), (b"a " * 5 + b"b " * 5 + b"c", 2),
         (b"x" * 300 + b" short " + b"Y" * 5000 + b"\n" + b"x" * 300, 10),
         (bytes(rng.randrange(256) for _ in range(20000)), 15)]
vocab = [bytes(rng.choice(letters) for _ in range(rng.randint(1, 60))) for _ in range(4000)]
cases.append((b" ".join(rng.choice(vocab) for _ in range(30000)) + b"\n", 25))
def name(i):
    out = b""
    while True:
        i, r = divmod(i, 26)
        out += bytes([97 + r])
        if i == 0:
            return out


cases.append((b"\n".join(name(i) for i in range(6000)) + b" aa ab", 5))
for i, (data, n) in enumerate(cases):
    r = subprocess.run(["./wordfreq", str(n)], cwd=work, input=data, capture_output=True, timeout=30, env=ENV)
    err = r.stderr.decode(errors="replace")
    want = expected(data, n)
    if r.returncode != 0 or sanitizer_trouble(err) or r.stdout != want:
        fails.append(f"wordfreq case {i} ({len(data)} bytes, N={n}): exit {r.returncode}\n"
                     f"got {r.stdout[:200]!r}\nwant {want[:200]!r}\n{err[-2500:]}")

for f in fails[:4]:
    print("FAIL", f)
print(f"{len(fails)} failing checks")
sys.exit(1 if fails else 0)
