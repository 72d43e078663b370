"""Grades /app/calc on the hidden cases. Writes reward.json: reward 1 only if every case passes."""
import json, signal, subprocess, sys
from fractions import Fraction

sys.path.insert(0, "/tests")
from cases import VALID, INVALID, FORMAT  # noqa: E402

results = []


def record(name, ok, detail=""):
    results.append(ok)
    if not ok:
        print(f"FAIL {name}: {detail}")


def alarm(*_):
    raise TimeoutError("case took too long")


signal.signal(signal.SIGALRM, alarm)
sys.path.insert(0, "/app")
try:
    import calc
    CalcError = calc.CalcError
    assert issubclass(CalcError, ValueError)
except BaseException as e:  # noqa: BLE001
    print("cannot import calc:", repr(e))
    calc = None

total = len(VALID) + len(INVALID) + len(FORMAT) + 5
if calc is not None:
    for expr, want in VALID:
        signal.alarm(2)
        try:
            value = calc.evaluate(expr)
            got = calc.format_result(value)
            ok = isinstance(value, Fraction) and got == want
            record(repr(expr), ok, f"got {got!r} ({type(value).__name__}), want {want!r}")
        except BaseException as e:  # noqa: BLE001
            record(repr(expr), False, f"raised {e!r}, want {want!r}")
        finally:
            signal.alarm(0)
    for expr in INVALID:
        signal.alarm(2)
        try:
            value = calc.evaluate(expr)
            record(repr(expr), False, f"returned {value!r}, want CalcError")
        except CalcError:
            record(repr(expr), True)
        except BaseException as e:  # noqa: BLE001
            record(repr(expr), False, f"raised {e!r}, want CalcError")
        finally:
            signal.alarm(0)
    for (p, q), want in FORMAT:
        try:
            got = calc.format_result(Fraction(p, q))
            record(f"format {p}/{q}", got == want, f"got {got!r}, want {want!r}")
        except BaseException as e:  # noqa: BLE001
            record(f"format {p}/{q}", False, repr(e))


def cli(*args):
    try:
        return subprocess.run([sys.executable, "-m", "calc", *args], cwd="/app", capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return None


r = cli("1/3 + 2^-1")
record("cli ok", r is not None and r.returncode == 0 and r.stdout == "5/6\n", r and (r.returncode, r.stdout, r.stderr))
r = cli("-2.5 * 2")
record("cli negative", r is not None and r.returncode == 0 and r.stdout == "-5\n", r and (r.returncode, r.stdout, r.stderr))
r = cli("1/0")
record("cli error", r is not None and r.returncode == 1 and r.stdout == "" and r.stderr.startswith("error: "), r and (r.returncode, r.stdout, r.stderr))
r = cli()
record("cli no args", r is not None and r.returncode == 2, r and r.returncode)
r = cli("1", "2")
record("cli two args", r is not None and r.returncode == 2, r and r.returncode)

passed = sum(results)
reward = 1.0 if calc is not None and passed == total else 0.0
out = {"reward": reward, "cases_passed": passed, "cases_total": total}
json.dump(out, open("/logs/verifier/reward.json", "w"))
print(out)
