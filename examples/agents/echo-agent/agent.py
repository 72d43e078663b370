"""The smallest agent program: one chat-completions call on the turn's prompt, its answer printed.

It finds everything in its environment: OPENAI_BASE_URL, OPENAI_API_KEY (a per-rollout secret,
never the provider key), OPENAI_MODEL and PROMPT_FILE. Any OpenAI client library works the same way.
"""

import json
import os
import urllib.request

with open(os.environ["PROMPT_FILE"], encoding="utf-8") as handle:
    prompt = handle.read()
body = {"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": prompt}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
    {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=600) as response:
    print(json.load(response)["choices"][0]["message"]["content"])
