from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from extproc.config import Config, parse_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_CONFIG = ROOT / "config" / "example.yaml"


class FakeClock:
    """A virtual clock for the core: tests move time explicitly."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def example_data() -> dict:
    return yaml.safe_load(EXAMPLE_CONFIG.read_text())


@pytest.fixture
def config(example_data: dict) -> Config:
    return parse_config(example_data, source=str(EXAMPLE_CONFIG))


def session_config_data() -> dict:
    """The example config where "summarise" is a task of its own (the cheap tier's), so tests
    can cross a drift boundary; a rule-less catch-all takes the rest."""
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    decisions = data["routing"]["decisions"]
    next(d for d in decisions if d["name"] == "agentic_routing")["rules"] = {
        "keywords": ["summarise"]}
    decisions.append({"name": "general", "difficulty": 0.4,
                      "modelRefs": [{"model": "qwen3-8b"}, {"model": "qwen3-32b"}]})
    return data


@pytest.fixture
def session_config() -> Config:
    return parse_config(session_config_data(), source="session-config")
