"""The package's public surface and its hygiene: what users may import, and a clean lint."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

import extproc
from tests.conftest import ROOT


def test_public_api_is_pinned():
    assert extproc.__all__ == [
        "Action", "Api", "Config", "ConfigError", "Phase", "RequestSummary",
        "ResponseObserver", "ResponseSummary", "Routed", "Router", "RoutingDecision",
        "RoutingError", "SaarEngine", "SessionIdentity", "load_config", "parse_config",
        "parse_request",
    ]
    for name in extproc.__all__:
        assert getattr(extproc, name) is not None


def test_core_imports_neither_grpc_nor_asyncio():
    """The policy core stays sans-IO: only the adapter and the app touch gRPC and the loop."""
    code = (
        "import sys; import extproc.core.router, extproc.core.saar, extproc.scheduling.placement; "
        "bad = [m for m in ('grpc', 'asyncio', 'aiohttp') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.skipif(shutil.which("ruff") is None and not (ROOT / ".venv/bin/ruff").exists(),
                    reason="ruff is installed by `make test`")
def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(ROOT / ".venv/bin/ruff")
    result = subprocess.run([ruff, "check", "extproc", "tests"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]


def test_mypy_is_clean():
    result = subprocess.run([sys.executable, "-m", "mypy", "extproc"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
