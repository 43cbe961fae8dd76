"""Fixtures for the deployment tests: renders of every values set, the CRD validator."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from . import k8s_schema
from .support import (
    CRD_DIR,
    VALUES_FILES,
    VENDORED_CRDS,
    Manifest,
    effective_values,
    render_chart,
    values_of,
)


@pytest.fixture(scope="session")
def render() -> Callable[..., Manifest]:
    return render_chart


@pytest.fixture(scope="session", params=sorted(VALUES_FILES))
def values_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def rendered_all() -> dict[str, Manifest]:
    return {name: render_chart(values_of(name)) for name in VALUES_FILES}


@pytest.fixture(scope="session")
def manifest(rendered_all: dict[str, Manifest], values_name: str) -> Manifest:
    """The render of each values set in turn."""
    return rendered_all[values_name]


@pytest.fixture(scope="session")
def values(values_name: str) -> dict[str, Any]:
    """The effective values of each values set in turn (the same order as ``manifest``)."""
    return effective_values(values_of(values_name))


@pytest.fixture(scope="session")
def default_manifest(rendered_all: dict[str, Manifest]) -> Manifest:
    return rendered_all["default"]


@pytest.fixture(scope="session")
def crd_validator() -> Iterator[k8s_schema.CrdValidator]:
    files = sorted(CRD_DIR.glob("*.yaml"))
    if not files:
        pytest.skip(f"upstream CRDs not found in {CRD_DIR} (the shared/k8s-crds folder beside "
                    "the checkout): InferencePool / HTTPRoute / Gateway schema and CEL checks "
                    "skipped")
    yield k8s_schema.CrdValidator(files + sorted(VENDORED_CRDS.glob("*.yaml")))
