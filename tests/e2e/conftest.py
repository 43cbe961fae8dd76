"""A real stack for the end-to-end tests: Envoy 1.40, the processor and simulated models."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from extproc.dev.harness import Stack, envoy_binary, run_stack
from tests.conftest import session_config_data

IDLE_TIMEOUT = 2
ADMIN_TOKEN_ENV = "SAAR_E2E_ADMIN_TOKEN"
ADMIN_TOKEN = os.environ.setdefault(ADMIN_TOKEN_ENV, "e2e-admin-token-0123456789abcdef")
"""The processors read it from their environment (``admin.token_env``), inherited from here."""


def e2e_config() -> dict[str, Any]:
    config = session_config_data()
    for decision in config["routing"]["decisions"]:
        aware = decision.setdefault("algorithm", {}).setdefault("session_aware", {})
        aware["idle_timeout_seconds"] = IDLE_TIMEOUT
    config["limits"]["max_body_bytes"] = 1 << 20
    config["health"] = {"failure_threshold": 3, "cooldown_seconds": 1}
    config["admin"] = {"token_env": ADMIN_TOKEN_ENV}
    return config


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Iterator[Stack]:
    with run_stack(e2e_config(), workdir=tmp_path_factory.mktemp("stack")) as running:
        yield running


def get_json(url: str) -> Any:
    """GET a JSON document, as the admin (the replay API needs the credential)."""
    request = urllib.request.Request(url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def replay_outcome(stack: Stack, replay_id: str, timeout: float = 3.0,
                   until: tuple[str, ...] = ()) -> dict[str, Any]:
    """The outcome is observed off the request path (observability mode), so it lands shortly
    after the client has the response, and grows: the status first, what a streamed answer
    carried when the observe stream reads its end. Poll until it has the keys ``until``
    names (any outcome when none)."""
    deadline = time.monotonic() + timeout
    while True:
        record = get_json(f"{stack.processor_http}/v1/replay/{replay_id}")
        outcome = record.get("outcome")
        if outcome is not None and all(k in outcome for k in until):
            return record
        if time.monotonic() > deadline:
            return record
        time.sleep(0.02)


def post_json(url: str, payload: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def violations(stack: Stack) -> int:
    return sum(
        sum(get_json(f"{url}/admin/state")["violations"].values())
        for urls in stack.sims.values() for url in urls
    )


def assert_fails_closed(bootstrap: Any, listen: int, admin: int) -> None:
    """Envoy started on ``bootstrap`` cannot reach the processor: a request gets the proxy's
    503 ``router_unavailable`` (the routing filter fails closed), never an unrouted answer."""
    envoy = subprocess.Popen([envoy_binary(), "-c", str(bootstrap), "--log-level", "error",
                              "--use-dynamic-base-id"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        _wait_ready(admin)
        request = urllib.request.Request(
            f"http://127.0.0.1:{listen}/v1/chat/completions",
            data=b'{"model":"auto","messages":[{"role":"user","content":"hi"}]}',
            headers={"content-type": "application/json", "authorization": "Bearer k"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 503
        assert b"router_unavailable" in caught.value.read()
    finally:
        envoy.terminate()
        envoy.wait(timeout=10)


def _wait_ready(admin: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("envoy did not become ready")
