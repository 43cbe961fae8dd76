from __future__ import annotations

from pathlib import Path

import hypothesis  # noqa: F401  (see below)
import pytest
import yaml

from extproc.config import Config, parse_config

# hypothesis is imported here, at collection, on purpose: otherwise its pytest plugin imports it
# at the very end of a session that used none of it, from deep inside pluggy, where CPython
# 3.11.7's compile() fails with "AST constructor recursion depth mismatch" and the run exits 1.

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
    """The example config as data, for tests that adjust it."""
    return yaml.safe_load(EXAMPLE_CONFIG.read_text())


@pytest.fixture
def session_config() -> Config:
    return parse_config(session_config_data(), source="session-config")
