"""What counting a request body's JSON values before parsing it costs (``nesting.count_values``).

The interception endpoint refuses a body of more than ``MAX_JSON_VALUES`` values before
``json.loads`` (32 MiB of ``{},`` parsed to ~900 MB). Prints the best of 5 for a 25 KB chat request
of 50 messages (under a million bytes: nothing to count), against parsing it, for 2 MiB of text
(four ``bytes.count`` passes) and for 32 MiB bodies that make the count walk the text (past the
bound on its first pass).

Usage: ``.venv/bin/python benchmarks/json_values.py``
"""

from __future__ import annotations

import json
import timeit

from prefect_rollouts.nesting import count_values


def best(function, number: int) -> float:
    """The best of 5 runs of ``number`` calls, in seconds per call."""
    return min(timeit.repeat(function, number=number, repeat=5)) / number


def main() -> None:
    chat = json.dumps({"model": "m", "messages": [
        {"role": "user" if index % 2 else "assistant", "content": "Lorem ipsum, dolor: sit amet " * 16}
        for index in range(50)]}).encode()
    print(f"25 KB chat request ({len(chat)} bytes): count {best(lambda: count_values(chat), 1000) * 1e6:.1f} µs, "
          f"json.loads {best(lambda: json.loads(chat), 1000) * 1e6:.1f} µs")
    text = json.dumps({"messages": [{"role": "user", "content": "Lorem ipsum, dolor: sit amet " * 75_000}]}).encode()
    print(f"2 MiB chat request of text: count {best(lambda: count_values(text), 20) * 1e3:.1f} ms")
    bodies = {"{}, (refused)": b"[" + b"{}," * 11_000_000 + b"{}]",
              "one string of commas (taken)": b'["' + b"a,b," * 8_000_000 + b'"]',
              "short strings (refused)": b"[" + b'"a",' * 8_000_000 + b'""]',
              "escaped quotes (taken)": b'["' + b'\\"' * 16_000_000 + b'"]'}
    for name, body in bodies.items():
        print(f"32 MiB of {name}: count {best(lambda body=body: count_values(body), 1) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
