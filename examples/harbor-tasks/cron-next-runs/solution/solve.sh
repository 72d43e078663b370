#!/bin/bash
set -e
cd /app
cat > /app/cronnext.py <<'PY'
"""Next run times of cron expressions. See /app/CRON_SPEC.md."""
import datetime as _dt

_FIELDS = [("minute", 0, 59, None), ("hour", 0, 23, None), ("day of month", 1, 31, None),
           ("month", 1, 12, ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]),
           ("day of week", 0, 7, ["sun", "mon", "tue", "wed", "thu", "fri", "sat"])]
_MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
           "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
HORIZON_DAYS = 3660


def _number(text, lo, hi, names, what):
    t = text.lower()
    if names and t in names:
        value = names.index(t) + (1 if what == "month" else 0)
    elif t.isascii() and t.isdigit():
        value = int(t)
    else:
        raise ValueError(f"bad {what} value {text!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{what} value {value} out of range {lo}-{hi}")
    return value


def _field(text, lo, hi, names, what):
    values = set()
    for item in text.split(","):
        if not item:
            raise ValueError(f"empty item in {what} field")
        rng, slash, step = item.partition("/")
        if slash:
            if not (step.isascii() and step.isdigit()) or int(step) == 0:
                raise ValueError(f"bad step {step!r} in {what} field")
            step = int(step)
        else:
            step = 1
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            sa, _, sb = rng.partition("-")
            a, b = _number(sa, lo, hi, names, what), _number(sb, lo, hi, names, what)
            if a > b:
                raise ValueError(f"bad range {rng!r} in {what} field")
        else:
            a = _number(rng, lo, hi, names, what)
            b = hi if slash else a
        values.update(range(a, b + 1, step))
    return values


def parse(expr):
    """(minutes, hours, doms, months, dows, dom_star, dow_star) of a cron expression."""
    if not isinstance(expr, str):
        raise ValueError("expression must be a string")
    expr = expr.strip()
    if expr.startswith("@"):
        if expr.lower() not in _MACROS:
            raise ValueError(f"unknown macro {expr!r}")
        expr = _MACROS[expr.lower()]
    parts = expr.split()
    if len(parts) != 5:
        raise ValueError("expected 5 fields")
    sets = [_field(p, lo, hi, names, what) for p, (what, lo, hi, names) in zip(parts, _FIELDS)]
    if 7 in sets[4]:
        sets[4].discard(7)
        sets[4].add(0)
    return (*sets, parts[2].startswith("*"), parts[4].startswith("*"))


def _day_matches(d, doms, months, dows, dom_star, dow_star):
    if d.month not in months:
        return False
    dom_ok = d.day in doms
    dow_ok = (d.isoweekday() % 7) in dows
    if dom_star or dow_star:
        return dom_ok and dow_ok
    return dom_ok or dow_ok


def next_runs(expr, after, count=1):
    """The next `count` datetimes strictly after `after` (naive) that match `expr`."""
    minutes, hours, doms, months, dows, dom_star, dow_star = parse(expr)
    if count < 0:
        raise ValueError("count must not be negative")
    out = []
    t = after.replace(second=0, microsecond=0) + _dt.timedelta(minutes=1)
    day = t.date()
    limit = after.date() + _dt.timedelta(days=HORIZON_DAYS)
    first_minute = (t.hour, t.minute)
    while len(out) < count:
        if day > limit:
            raise ValueError("no matching time within the horizon")
        if _day_matches(day, doms, months, dows, dom_star, dow_star):
            for h in sorted(hours):
                for m in sorted(minutes):
                    if day == t.date() and (h, m) < first_minute:
                        continue
                    out.append(_dt.datetime(day.year, day.month, day.day, h, m))
                    if len(out) == count:
                        return out
            limit = day + _dt.timedelta(days=HORIZON_DAYS)
        day += _dt.timedelta(days=1)
    return out
PY
python3 -c 'import datetime, cronnext; print(cronnext.next_runs("0 0 13 * fri", datetime.datetime(2024, 9, 1), 3))'
