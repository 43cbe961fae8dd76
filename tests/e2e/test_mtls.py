"""Mutual TLS between Envoy and the processor, through the real Envoy: a processor with
``server.tls.client_ca_file`` serves the Envoy whose bootstrap (``saar envoy-config
--processor-client-cert/-key``) presents a client certificate its CA signed; an Envoy with no
client certificate, or one another CA signed, cannot reach it and fails closed (503, never an
unrouted request). Certificates are made with ``cryptography`` (``tests/certs.py``)."""

from __future__ import annotations

import contextlib
import io
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai import OpenAI

from extproc.adapter.bootstrap import ProcessorTls
from extproc.cli import main
from extproc.dev.harness import Stack, free_port, run_stack
from tests.certs import Authority
from tests.e2e.conftest import assert_fails_closed, e2e_config

pytestmark = pytest.mark.e2e
NAME = "saar-router.test"
HARD = "Please refactor the storage layer."


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("mtls")
    ca = Authority("saar test CA")
    paths: dict[str, Path] = {}
    paths["cert"], paths["key"] = ca.issue(NAME).write(folder, "server")
    paths["client_cert"], paths["client_key"] = ca.issue("envoy", client=True).write(
        folder, "envoy")
    stranger = Authority("another CA").issue("envoy", client=True)
    paths["stranger_cert"], paths["stranger_key"] = stranger.write(folder, "stranger")
    paths["ca"] = folder / "ca.crt"
    paths["ca"].write_bytes(ca.pem)
    return paths


def _config(certificates: dict[str, Path]) -> dict[str, Any]:
    config = e2e_config()
    config.setdefault("server", {})["tls"] = {
        "enabled": True, "cert_file": str(certificates["cert"]),
        "key_file": str(certificates["key"]), "client_ca_file": str(certificates["ca"])}
    return config


@pytest.fixture(scope="module")
def mtls_stack(tmp_path_factory, certificates) -> Iterator[tuple[Stack, dict[str, Any]]]:
    config = _config(certificates)
    tls = ProcessorTls(str(certificates["ca"]), NAME, str(certificates["client_cert"]),
                       str(certificates["client_key"]))
    with run_stack(config, workdir=tmp_path_factory.mktemp("mtls-stack"),
                   processor_tls=tls) as running:
        yield running, config


def test_envoy_presenting_the_client_certificate_routes(mtls_stack) -> None:
    stack, _ = mtls_stack
    client = OpenAI(base_url=f"{stack.url}/v1", api_key="key-1", max_retries=0,
                    default_headers={"x-session-id": "mtls"})
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": HARD}])
    assert raw.parse().model == "qwen3-32b"             # routed: the processor answered
    assert raw.headers["x-replay-id"].startswith("rp-")
    stats = urllib.request.urlopen(f"http://127.0.0.1:{stack.envoy_admin}/stats?filter="
                                   "saar_extproc.ssl.handshake", timeout=5).read().decode()
    assert int(stats.split(":")[-1]) >= 1, stats        # over TLS


@pytest.mark.parametrize("client", ["none", "stranger"])
def test_envoy_without_a_certificate_the_ca_signed_fails_closed(
        mtls_stack, certificates, tmp_path, client) -> None:
    """The bootstrap `saar envoy-config` writes without --processor-client-cert (or with a
    certificate another CA signed): the processor refuses the handshake, Envoy's routing
    filter fails closed and the client gets the proxy's 503."""
    stack, config = mtls_stack
    config_path = tmp_path / "saar.yaml"
    config_path.write_text(yaml.safe_dump(config))
    listen, admin = free_port(), free_port()
    argv = ["envoy-config", "--config", str(config_path), "--listen-port", str(listen),
            "--admin-port", str(admin), "--processor-port", str(stack.processors[0].grpc_port),
            "--processor-ca", str(certificates["ca"]), "--processor-name", NAME]
    if client == "stranger":
        argv += ["--processor-client-cert", str(certificates["stranger_cert"]),
                 "--processor-client-key", str(certificates["stranger_key"])]
    envoy_yaml = tmp_path / "envoy.yaml"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    envoy_yaml.write_text(out.getvalue())
    assert_fails_closed(envoy_yaml, listen, admin)
