"""Who may reach the running service: mutual TLS on the gRPC port (``server.tls.client_ca_file``:
a caller without a certificate the CA signed is refused at the handshake, a new CA file is
read without a restart) and the HTTP port on loopback unless ``server.http_host`` says
otherwise."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.config import Config, ConfigError, Tls, parse_config
from extproc.service.app import start
from extproc.service.preflight import file_problems
from tests.certs import Authority

NAME = "saar-router.test"


def _tls_config(config: Config, folder: Path, ca: Authority, **server: object) -> Config:
    cert, key = ca.issue(NAME).write(folder, "server")
    client_ca = folder / "client-ca.crt"
    client_ca.write_bytes(ca.pem)
    tls = Tls(enabled=True, cert_file=str(cert), key_file=str(key),
              client_ca_file=str(client_ca))
    return replace(config, server=replace(config.server, grpc_port=0, http_port=0, tls=tls,
                                          **server))  # type: ignore[arg-type]


async def _health(port: int, ca: Authority, client: tuple[bytes, bytes] | None) -> int:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.pem, private_key=client[1] if client else None,
        certificate_chain=client[0] if client else None)
    async with grpc.aio.secure_channel(
            f"127.0.0.1:{port}", credentials,
            options=[("grpc.ssl_target_name_override", NAME)]) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="liveness"), timeout=5)
        return reply.status


@pytest.mark.parametrize("caller", ["none", "stranger"])
async def test_mutual_tls_refuses_a_caller_the_ca_did_not_sign(config, tmp_path, caller):
    ca = Authority("gateway clients CA")
    running = await start(_tls_config(config, tmp_path, ca))
    try:
        own = ca.issue("envoy", client=True)
        assert await _health(running.grpc_port, ca, (own.certificate, own.key)) == \
            health_pb2.HealthCheckResponse.SERVING
        other = Authority("someone else's CA").issue("envoy", client=True)
        refused = None if caller == "none" else (other.certificate, other.key)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _health(running.grpc_port, ca, refused)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await running.stop()


async def test_a_new_client_ca_is_read_without_a_restart(config, tmp_path):
    first, second = Authority("first CA"), Authority("second CA")
    running = await start(_tls_config(config, tmp_path, first))
    try:
        newcomer = second.issue("envoy", client=True)
        client = (newcomer.certificate, newcomer.key)
        with pytest.raises(grpc.aio.AioRpcError):
            await _health(running.grpc_port, first, client)
        path = tmp_path / "client-ca.crt"
        path.write_bytes(first.pem + second.pem)          # a bundle: old and new clients
        os.utime(path, ns=(1, 1))                          # a new stamp even within one tick
        assert await _health(running.grpc_port, first, client) == \
            health_pb2.HealthCheckResponse.SERVING
    finally:
        await running.stop()


def test_client_ca_needs_tls_and_a_readable_certificate(example_data, tmp_path) -> None:
    data = {**example_data, "server": {"tls": {"client_ca_file": "/ca.pem"}}}
    with pytest.raises(ConfigError, match="client_ca_file needs enabled: true"):
        parse_config(data)
    missing = parse_config({**example_data, "server": {"tls": {
        "enabled": True, "client_ca_file": str(tmp_path / "nope.pem")}}})
    assert any(p.startswith("server.tls.client_ca_file:") for p in file_problems(missing))
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    wrong = parse_config({**example_data, "server": {"tls": {
        "enabled": True, "client_ca_file": str(tmp_path / "key.pem")}}})
    assert "server.tls.client_ca_file: " + str(tmp_path / "key.pem") + " is not a PEM " \
        "certificate" in file_problems(wrong)


async def _reachable(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


async def test_the_http_port_stays_on_loopback_when_grpc_listens_everywhere(config) -> None:
    """``server.host: 0.0.0.0`` opens the gRPC ports; the HTTP port (admin API, replay
    records, web view) stays on 127.0.0.1 unless ``server.http_host`` opens it too. (Another
    address of this host, 127.0.0.2, reaches a port bound to every interface only.)"""
    everywhere = replace(config.server, host="0.0.0.0", grpc_port=0, http_port=0)
    running = await start(replace(config, server=everywhere))
    try:
        assert await _reachable("127.0.0.2", running.grpc_port)
        assert not await _reachable("127.0.0.2", running.http_port)
        assert await _reachable("127.0.0.1", running.http_port)
    finally:
        await running.stop()
    running = await start(replace(config, server=replace(everywhere, http_host="0.0.0.0")))
    try:
        async with httpx.AsyncClient() as client:
            reply = await client.get(f"http://127.0.0.2:{running.http_port}/healthz")
            assert reply.status_code == 200
    finally:
        await running.stop()
