import os
import sys

import pytest

sys.path.insert(0, os.environ["MERGED_TREE"])
from appconfig import load_config  # noqa: E402


def test_comments_and_retry_settings():
    cfg = load_config("# retry policy\nretries = 4   # more than default\nbackoff=2\n", env={})
    assert cfg["retries"] == 4 and cfg["backoff"] == 2.0 and isinstance(cfg["backoff"], float)


def test_comment_lines_are_not_malformed():
    cfg = load_config("# just a comment without equals\n   # another one\nhost = h # x", env={})
    assert cfg["host"] == "h"


def test_malformed_line_number_counts_all_lines():
    with pytest.raises(ValueError) as err:
        load_config("# header\n\nport = 1\nnot a setting # comment", env={})
    assert str(err.value).startswith("line 4:")


def test_unknown_key_after_comment_strip():
    with pytest.raises(ValueError):
        load_config("colour = blue # nope", env={})


def test_env_overrides_new_keys():
    cfg = load_config("retries = 1", env={"APP_RETRIES": "7", "APP_BACKOFF": " 0.25 ", "APP_UNUSED": "1"})
    assert cfg["retries"] == 7 and cfg["backoff"] == 0.25 and "unused" not in cfg


def test_env_overrides_are_validated():
    for env in ({"APP_RETRIES": "11"}, {"APP_BACKOFF": "-0.5"}, {"APP_RETRIES": "many"}):
        with pytest.raises(ValueError):
            load_config("", env=env)


def test_os_environ_is_default(monkeypatch):
    monkeypatch.setenv("APP_TIMEOUT", "5")
    monkeypatch.setenv("APP_RETRIES", "0")
    cfg = load_config("timeout = 9")
    assert cfg["timeout"] == 5 and cfg["retries"] == 0
