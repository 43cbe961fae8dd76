"""The service as a gateway meets it: TLS on the gRPC port (self-signed, or files reloaded when
they change), a plaintext health port for kubelet, and readiness held back until the pool's
workers are known (Kubernetes discovery, against a recorded API) and the store answers."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.config import Discovery, Tls
from extproc.service.app import start
from extproc.service.tls import self_signed
from tests.scheduling.k8s_api import FakeApiServer, listed

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def served_certificate(port: int) -> str:
    return ssl.get_server_certificate(("127.0.0.1", port))


async def health(channel: grpc.aio.Channel, service: str) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(reply.status)


def secure(port: int, certificate: str, name: str = "localhost") -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(root_certificates=certificate.encode())
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials,
                                   options=[("grpc.ssl_target_name_override", name)])


def with_server(config, **server):
    return replace(config, server=replace(config.server, grpc_port=0, http_port=0, **server))


async def test_tls_without_files_serves_a_self_signed_certificate(config):
    running = await start(with_server(config, tls=Tls(enabled=True), health_port=0))
    try:
        certificate = await asyncio.to_thread(served_certificate, running.grpc_port)
        async with secure(running.grpc_port, certificate) as channel:
            assert await health(channel, "readiness") == SERVING
        # Plaintext cannot talk to it...
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await health(channel, "liveness")
        # ...but kubelet's probes can, on the health port, and find nothing else there.
        assert running.health_port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.health_port}") as channel:
            assert await health(channel, "liveness") == SERVING
            assert await health(channel, "readiness") == SERVING
            from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in ep_grpc.ExternalProcessorStub(channel).Process(iter(())):
                    pass
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await running.stop()


async def test_certificate_files_are_reloaded_when_they_change(config, tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first_key, first_cert = self_signed(("first.example",))
    cert.write_bytes(first_cert)
    key.write_bytes(first_key)
    tls = Tls(enabled=True, cert_file=str(cert), key_file=str(key))
    running = await start(with_server(config, tls=tls))
    try:
        seen = await asyncio.to_thread(served_certificate, running.grpc_port)
        assert seen.encode().strip() == first_cert.strip()
        second_key, second_cert = self_signed(("second.example",))
        # As a Secret volume does it: the new pair appears, the files change under the mount.
        key.write_bytes(second_key)
        cert.write_bytes(second_cert)
        seen = await asyncio.to_thread(served_certificate, running.grpc_port)
        assert seen.encode().strip() == second_cert.strip()
        assert running.certificates is not None and running.certificates.reloads == 1
        async with secure(running.grpc_port, second_cert.decode(), "second.example") as channel:
            assert await health(channel, "liveness") == SERVING
        cert.write_text("not a certificate")  # half-written: the last good one stays
        seen = await asyncio.to_thread(served_certificate, running.grpc_port)
        assert seen.encode().strip() == second_cert.strip()
    finally:
        await running.stop()


PODS = "/api/v1/namespaces/llm/pods"
POOLS = "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools"


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {"token": "t"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }))
    return path


async def test_readiness_waits_for_the_pools_pods_then_they_are_its_workers(
        config, tmp_path, monkeypatch):
    with FakeApiServer() as api:
        api.script(POOLS, listed("pool-list.json"))
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", api.url)))
        scheduling = replace(config.scheduling, pool_name="qwen3-8b", discovery=Discovery(
            mode="kubernetes", namespace="llm", inference_pool="saar-extproc-qwen3-8b"))
        models = {name: replace(m, endpoints=()) for name, m in config.models.items()}
        running = await start(replace(with_server(config, health_port=0), models=models,
                                      scheduling=scheduling))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.health_port}") as ch:
                await asyncio.sleep(0.5)  # the pod list fails (nothing recorded yet)
                assert await health(ch, "liveness") == SERVING
                assert await health(ch, "readiness") == NOT_SERVING
                assert await health(
                    ch, "envoy.service.ext_proc.v3.ExternalProcessor") == NOT_SERVING
                api.script(PODS, listed("pods-list-2.json"))
                await asyncio.wait_for(running.ready.wait(), 15)
                assert await health(ch, "readiness") == SERVING
            pool = {w.address for w in running.parts.pools.registry.pool("qwen3-8b")}
            assert pool == {"10.2.0.12:8000", "10.2.0.13:8000"}
            assert set(running.parts.config.models) == {"qwen3-8b"}  # the pool's own view
        finally:
            await running.stop()


async def test_readiness_waits_for_the_shared_store(config, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    unreachable = replace(config, state=replace(config.state, store="redis",
                                                redis_url="redis://127.0.0.1:9/0"),
                          identity=replace(config.identity, tenant_secret_file=str(secret)))
    running = await start(with_server(unreachable))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            await asyncio.sleep(0.3)
            assert await health(channel, "liveness") == SERVING
            assert await health(channel, "readiness") == NOT_SERVING
        assert not running.ready.is_set()
    finally:
        await running.stop()


async def test_kubernetes_discovery_needs_a_pool(config):
    from extproc.config import ConfigError

    scheduling = replace(config.scheduling, discovery=Discovery(
        mode="kubernetes", inference_pool="p"))
    with pytest.raises(ConfigError, match="--pool-name"):
        await start(replace(with_server(config), scheduling=scheduling))


async def test_a_silent_store_is_logged_once_not_every_poll(config, tmp_path, caplog):
    """Readiness asks the store every 100 ms; a store that stays down is one warning (then
    one per 10 s), not ten lines a second."""
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    unreachable = replace(config, state=replace(config.state, store="redis",
                                                redis_url="redis://127.0.0.1:9/0"),
                          identity=replace(config.identity, tenant_secret_file=str(secret)))
    caplog.set_level("INFO", logger="extproc.service.app")
    running = await start(with_server(unreachable))
    try:
        await asyncio.sleep(1.2)               # about ten polls
        assert not running.ready.is_set()
    finally:
        await running.stop()
    lines = [r for r in caplog.records if "the shared store does not answer" in r.message]
    assert len(lines) == 1, [r.message for r in lines]
    assert lines[0].levelname == "WARNING"
