"""The configuration reference in docs/ is generated and current, and lists every key a real
config sets (walked from the YAML, not from the schema the generator reads)."""

from __future__ import annotations

from pathlib import Path

import yaml

from extproc.dev import config_reference

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_is_current():
    assert config_reference.main(["--check"]) == 0


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
