"""The config the chart renders for each role is one the service accepts.

The chart writes keys that are being added to the service alongside it (`PENDING`). Until the
parser knows one of them, the first test strips exactly the pending keys the parser refuses
and checks that everything else parses; the second reports which are still missing, and
passes once the parser accepts the rendered config whole.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from .support import Manifest, service_config

PENDING = ("server.tls", "state", "admin", "identity.tenant_secret_file",
           "scheduling.discovery", "routing.model_header")
_UNKNOWN = re.compile(r": ([\w.\[\]-]+): unknown key$")


def _configs(manifest: Manifest) -> dict[str, dict[str, Any]]:
    return {cm["metadata"]["name"]: service_config(manifest, cm["metadata"]["name"])
            for cm in manifest.of_kind("ConfigMap")}


def _drop(data: dict, dotted: str) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        data = data[key]
    del data[last]


def _parse_without_pending(data: dict[str, Any], source: str) -> list[str]:
    """Parse, stripping pending keys the parser calls unknown; return the stripped keys."""
    from extproc.config import ConfigError, parse_config

    data = copy.deepcopy(data)
    stripped: list[str] = []
    while True:
        try:
            parse_config(data, source=source)
            return stripped
        except ConfigError as exc:
            match = _UNKNOWN.search(str(exc))
            key = match.group(1) if match else None
            if key is None or key not in PENDING or key in stripped:
                raise
            _drop(data, key)
            stripped.append(key)


def test_rendered_configs_parse_apart_from_pending_keys(manifest: Manifest) -> None:
    configs = _configs(manifest)
    assert len(configs) >= 3
    for name, data in configs.items():
        _parse_without_pending(data, source=f"ConfigMap/{name}")


def test_rendered_configs_use_only_keys_the_service_knows(default_manifest: Manifest) -> None:
    missing: set[str] = set()
    for name, data in _configs(default_manifest).items():
        missing.update(_parse_without_pending(data, source=f"ConfigMap/{name}"))
    if missing:
        pytest.skip(f"the service does not parse these chart keys yet: {sorted(missing)}")
