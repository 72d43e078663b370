"""What ``endpoint_body.read_json`` costs on a 50 KB chat request of 50 messages: parse only (no walk),
and with the walk (the body holds the launch key). Best of 5 runs of 200 reads each.

Run: ``PYTHONPATH=src python benchmarks/endpoint_body.py``
"""

from __future__ import annotations

import json
import timeit

from prefect_rollouts.harnesses.endpoint_body import read_json
from prefect_rollouts.nesting import loads

SECRET = "sk-launch-" + "k" * 33
messages = [{"role": "user" if i % 2 else "assistant", "content": "word " * 200} for i in range(50)]
plain = json.dumps({"messages": messages, "tools": [{"type": "function", "function": {"name": "f"}}]}).encode()
keyed = json.dumps({"messages": [*messages, {"role": "user", "content": SECRET}]}).encode()

for name, call in [("loads alone", lambda: loads(plain, "b")), ("read_json, no walk", lambda: read_json(plain, SECRET)),
                   ("read_json, walked", lambda: read_json(keyed, SECRET))]:
    best = min(timeit.repeat(call, number=200, repeat=5)) / 200
    print(f"{name:20} {len(plain) / 1000:.0f} KB: {best * 1e6:.0f} µs")
