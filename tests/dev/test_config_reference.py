"""The configuration reference in docs/ is generated and current, lists every key a real
config sets (walked from the YAML, not from the schema the generator reads), says what each key
means (its docstring) and states the defaults a config without the key gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic_core import to_jsonable_python

from extproc.config import parse_config
from extproc.dev import config_reference

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_is_current():
    assert config_reference.main(["--check"]) == 0


def test_every_key_says_what_it_means():
    """A key added without a docstring fails here: the reference's meaning is the docstring."""
    assert [r.key for r in config_reference.rows() if not r.meaning] == []


ROWS = {r.key: r for r in config_reference.rows()}


@pytest.mark.parametrize(("key", "default"), [
    ("models.NAME.cluster", "required"),
    ("state.settle_ms", "`100.0`"),
    ("routing.logical_models", '`["auto"]`'),
    # factory defaults, which the schema leaves out
    ("routing.decisions[].rules.headers", "`{}`"),
    ("observability.otlp.headers", "`{}`"),
    ("scheduling.flow_control.tenant_weights", "`{}`"),
    ("scheduling.disaggregation.scorers",
     '`{"prefix": 3.0, "queue": 2.0, "kv_utilization": 1.0}`'),
])
def test_defaults(key, default):
    assert ROWS[key].default == default


@pytest.mark.parametrize("key", ["scheduling.scorers", "scheduling.flow_control.classes"])
def test_a_factory_default_is_what_a_config_without_the_key_gets(key):
    config = parse_config({"models": {"m": {"cluster": "m"}}, "routing": {"logical_models": []}})
    value = config
    for part in key.split("."):
        value = getattr(value, part)
    assert json.loads(ROWS[key].default.strip("`")) == to_jsonable_python(value)


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            name = "NAME" if prefix in ("models.",) else key
            yield from _leaves(value, f"{prefix}{name}.")
    elif isinstance(node, list) and node and isinstance(node[0], dict):
        for item in node:
            yield from _leaves(item, prefix.rstrip(".") + "[].")
    else:
        yield prefix.rstrip(".")


def test_every_key_of_the_example_config_is_in_the_reference():
    page = (ROOT / "docs" / "configuration.md").read_text()
    generated = page.partition(config_reference.BEGIN)[2]
    rows = {cells[0].strip("` "): cells[1].strip() for line in generated.splitlines()
            if line.startswith("| `") and len(cells := line[1:].split(" | ")) >= 2}
    maps = {key for key, kind in rows.items() if kind.startswith("map of")} - {"models"}
    example = yaml.safe_load((ROOT / "config" / "example.yaml").read_text())
    missing = []
    for key in _leaves(example):
        # A map's member keys (rules' headers, weights by name) are the user's, not the schema's.
        parts = key.split(".")
        if key not in rows and not any(".".join(parts[:n]) in maps for n in range(len(parts))):
            missing.append(key)
    assert missing == []


def test_a_stale_page_is_caught(tmp_path, monkeypatch):
    page = tmp_path / "configuration.md"
    page.write_text(config_reference.updated("# Configuration reference\n").replace(
        "`state.settle_ms` | number | `100.0`", "`state.settle_ms` | number | `50.0`"))
    monkeypatch.setattr(config_reference, "PAGE", page)
    assert config_reference.main(["--check"]) == 1
    assert config_reference.main([]) == 0
    assert "`state.settle_ms` | number | `100.0`" in page.read_text()
