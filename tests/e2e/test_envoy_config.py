"""`saar envoy-config` through the real Envoy: ``GET /v1/models`` answers the logical and the
physical models with their context windows (as vLLM's ``max_model_len`` and the other names
clients read); the ``--fragment`` parts run inside an Envoy of the user's own; a processor
serving TLS is reached over TLS, its certificate verified against the CA (a wrong CA fails
closed, as the routing filter must)."""

from __future__ import annotations

import copy
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai import OpenAI

from extproc.adapter.bootstrap import EnvoyPorts, ProcessorTls, bootstrap, fragment
from extproc.config import parse_config
from extproc.dev.harness import Stack, free_port, run_stack
from extproc.service.tls import issue
from tests.e2e.conftest import assert_fails_closed, e2e_config

pytestmark = pytest.mark.e2e
HARD = "Please refactor the storage layer."
NAME = "saar-router.test"


def windowed_config() -> dict[str, Any]:
    """Two models with different windows; one decision reaches both, one only the small
    one: ``auto`` can count on the small model's window only."""
    config = e2e_config()
    config["models"]["qwen3-8b"]["context_window"] = 32768
    config["models"]["qwen3-32b"]["context_window"] = 131072
    decisions = config["routing"]["decisions"]
    decisions[-1]["modelRefs"] = [{"model": "qwen3-8b"}]
    return config


def windows_expected(config: dict[str, Any]) -> dict[str, int]:
    """The oracle, from the config data: a physical model's own window; a logical one's is
    the smallest, over the decisions, of the largest window each decision reaches."""
    models = {name: m["context_window"] for name, m in config["models"].items()}
    reach = [max(models[r["model"]] for r in d["modelRefs"])
             for d in config["routing"]["decisions"]]
    return {**dict.fromkeys(config["routing"]["logical_models"], min(reach)), **models}


def _own_envoy(config: dict[str, Any], tls: ProcessorTls) -> Any:
    """An Envoy of the user's own (its listener, its catch-all route, its model clusters), with
    the fragment's filters, processor clusters and routes put in."""
    def transform(doc: dict[str, Any]) -> dict[str, Any]:
        resources = doc["static_resources"]
        listener = resources["listeners"][0]
        processor = next(c for c in resources["clusters"] if c["name"] == "saar_extproc")
        address = processor["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
        port = address["endpoint"]["address"]["socket_address"]["port_value"]
        parts = fragment(parse_config(config), EnvoyPorts(processor_port=port,
                                                          processor_tls=tls))
        mine = [c for c in resources["clusters"] if c["name"] in
                {m["cluster"] for m in config["models"].values()}]
        default = mine[0]["name"]
        manager = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network."
                     "http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "mine",
            "normalize_path": True, "merge_slashes": True,
            "route_config": {"virtual_hosts": [{
                "name": "mine", "domains": ["*"],
                "routes": [*parts["routes"], {
                    "match": {"prefix": "/"}, "route": {"cluster": default},
                    "typed_per_filter_config": copy.deepcopy(
                        parts["routes"][-1]["typed_per_filter_config"])}],
            }]},
            "http_filters": [*parts["http_filters"], {
                "name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3."
                             "Router"}}],
        }
        return {"admin": doc["admin"], "static_resources": {
            "listeners": [{"name": "mine", "address": listener["address"],
                           "per_connection_buffer_limit_bytes": 33554432,
                           "filter_chains": [{"filters": [{
                               "name": "envoy.filters.network.http_connection_manager",
                               "typed_config": manager}]}]}],
            "clusters": [*parts["clusters"], *mine]}}
    return transform


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tls")
    issued = issue((NAME, "localhost"), days=1)
    wrong = issue((NAME,), days=1)                      # a CA that did not sign it
    files = {"cert": issued.certificate, "key": issued.key, "ca": issued.ca, "wrong": wrong.ca}
    paths = {}
    for name, data in files.items():
        paths[name] = folder / f"{name}.pem"
        paths[name].write_bytes(data)
    return paths


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory, tls_files) -> Iterator[tuple[Stack, dict[str, Any]]]:
    config = windowed_config()
    config.setdefault("server", {})["tls"] = {
        "enabled": True, "cert_file": str(tls_files["cert"]), "key_file": str(tls_files["key"])}
    tls = ProcessorTls(str(tls_files["ca"]), NAME)
    with run_stack(config, workdir=tmp_path_factory.mktemp("own"), processor_tls=tls,
                   envoy_transform=_own_envoy(config, tls)) as running:
        yield running, config


def _client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="key-1", max_retries=0,
                  default_headers={"x-session-id": "envoy-config"})


def _windows(client: OpenAI) -> dict[str, dict[str, Any]]:
    return {m.id: (m.model_extra or {}) for m in client.models.list()}


def test_the_full_bootstrap_lists_logical_and_physical_models(stack) -> None:
    """The shared stack's Envoy (rendered as `saar envoy-config` does) answers the list;
    no model server is asked (a simulator would list only itself)."""
    listed = _windows(_client(stack.url))
    expected = windows_expected(e2e_config())
    assert list(listed) == list(expected)               # logical models first
    for name, window in expected.items():
        for field in ("max_model_len", "context_length", "context_window"):
            assert listed[name][field] == window, (name, field)


def test_the_fragment_lists_the_windows_in_an_envoy_of_ones_own(own_stack) -> None:
    stack, config = own_stack
    client = _client(stack.url)
    listed = _windows(client)
    expected = windows_expected(config)
    assert {name: extra["max_model_len"] for name, extra in listed.items()} == expected
    assert expected["auto"] == 32768                    # the decision that reaches 8b only
    one = client.models.retrieve("auto")
    assert (one.id, (one.model_extra or {})["max_model_len"]) == ("auto", 32768)
    with urllib.request.urlopen(f"{stack.url}/v1/models", timeout=5) as response:
        assert response.headers["content-type"] == "application/json"


def test_the_fragment_routes_over_verified_tls(own_stack) -> None:
    stack, _ = own_stack
    raw = _client(stack.url).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": HARD}])
    assert raw.parse().model == "qwen3-32b"             # routed: the processor answered
    assert raw.headers["x-sim-instance"] == "qwen3-32b-0"
    stats = urllib.request.urlopen(f"http://127.0.0.1:{stack.envoy_admin}/stats?filter="
                                   "saar_extproc.ssl.handshake", timeout=5).read().decode()
    handshakes = int(stats.split(":")[-1])
    assert handshakes >= 1, stats                       # over TLS, not plaintext


def test_a_processor_certificate_the_ca_did_not_sign_fails_closed(
        own_stack, tls_files, tmp_path) -> None:
    """Envoy with the wrong CA cannot reach the processor: the routing filter fails closed,
    and the client gets the proxy's 503 (never an unrouted request)."""
    stack, config = own_stack
    listen, admin = free_port(), free_port()
    ports = EnvoyPorts(listen=listen, admin=admin, processor_port=stack.processors[0].grpc_port,
                       processor_tls=ProcessorTls(str(tls_files["wrong"]), NAME))
    path = tmp_path / "wrong-ca.yaml"
    path.write_text(yaml.safe_dump(bootstrap(parse_config(config), ports)))
    assert_fails_closed(path, listen, admin)
