"""Grades /app/cronnext.py on hidden cases; reward 1 only if every case passes."""
import datetime as dt, json, signal, sys, time

cases = json.load(open("/tests/cases.json"))
total = len(cases["valid"]) + len(cases["invalid"])
passed = 0


def alarm(*_):
    raise TimeoutError("took more than 3 s")


signal.signal(signal.SIGALRM, alarm)
sys.path.insert(0, "/app")
try:
    import cronnext
    fn = cronnext.next_runs
except BaseException as e:  # noqa: BLE001
    print("cannot import cronnext.next_runs:", repr(e))
    fn = None

if fn is not None:
    for c in cases["valid"]:
        after = dt.datetime.fromisoformat(c["after"])
        signal.alarm(3)
        try:
            got = fn(c["expr"], after, c["count"])
            ok = isinstance(got, list) and all(type(t) is dt.datetime and t.second == 0 and t.microsecond == 0 and t.tzinfo is None for t in got) \
                and [t.strftime("%Y-%m-%d %H:%M") for t in got] == c["want"]
            detail = got
        except BaseException as e:  # noqa: BLE001
            ok, detail = False, repr(e)
        finally:
            signal.alarm(0)
        passed += ok
        if not ok:
            print(f"FAIL {c['expr']!r} after {c['after']} x{c['count']}: got {detail!r}, want {c['want']}")
    for c in cases["invalid"]:
        signal.alarm(3)
        try:
            got = fn(c["expr"], dt.datetime.fromisoformat(c["after"]), c["count"])
            ok, detail = False, f"returned {got!r}"
        except ValueError:
            ok = True
        except BaseException as e:  # noqa: BLE001
            ok, detail = False, repr(e)
        finally:
            signal.alarm(0)
        passed += ok
        if not ok:
            print(f"FAIL {c['expr']!r} x{c['count']}: {detail}, want ValueError")

result = {"reward": 1.0 if passed == total else 0.0, "cases_passed": passed, "cases_total": total}
json.dump(result, open("/logs/verifier/reward.json", "w"))
print(result)
