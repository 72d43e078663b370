"""Next run times of cron expressions. See /app/CRON_SPEC.md."""
import datetime


def next_runs(expr: str, after: datetime.datetime, count: int = 1) -> list:
    """The next `count` naive datetimes strictly after `after` that match `expr`."""
    raise NotImplementedError
