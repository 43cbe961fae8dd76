"""The real-engine backends' pieces that hold logic: saar's config over a pool that says more
of its engines, the vLLM pool's reset, and what runs over Dynamo's mockers (the router set,
the worker slots that let saar name a mocker)."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from extproc.config import parse_config
from extproc.dev.bench.peers.backends import (
    BACKENDS,
    Direct,
    Pool,
    VllmBackend,
    reset_prefix_caches,
)
from extproc.dev.bench.peers.dynamo_backend import (
    AFFINITY_TTL_S,
    DynamoBackend,
    DynamoKvRouter,
    SaarOverDynamo,
    WorkerSlots,
    slot_routes,
    slots_bootstrap,
)
from extproc.dev.bench.peers.routers import PeerRouter, saar_config
from extproc.dev.bench.peers.run import shapes
from extproc.dev.bench.peers.settings import DYNAMO_ROUTERS, ROUTERS, Settings
from extproc.dev.engines.dynamo import WORKER_HEADER

WORKERS = ("http://127.0.0.1:8001", "http://127.0.0.1:8002")


def pool(**more) -> Pool:
    return Pool(WORKERS, "tiny", 16384, dict, lambda: None, **more)


def test_saar_over_a_plain_pool_lists_its_endpoints():
    config = saar_config(pool())
    assert config["models"]["tiny"]["endpoints"] == ["127.0.0.1:8001", "127.0.0.1:8002"]
    assert "scheduling" not in config
    parse_config(config)


def test_saar_over_real_vllm_reads_its_kv_events_in_precise_mode(tmp_path):
    tokenizer = tmp_path / "model"
    tokenizer.mkdir()
    workers = [{"address": "127.0.0.1:8001", "kv_events": "ipc:///tmp/kv-0.ipc"},
               {"address": "127.0.0.1:8002", "kv_events": "ipc:///tmp/kv-1.ipc"}]
    prefix = {"mode": "precise", "tokenizer": str(tokenizer), "block_size": 128}
    config = saar_config(pool(saar_model={"workers": workers, "context_window": 8192},
                              saar_config={"scheduling": {"prefix": prefix}},
                              precise_block_size=128))
    model = config["models"]["tiny"]
    assert "endpoints" not in model and model["workers"] == workers
    assert model["context_window"] == 8192
    assert config["scheduling"]["prefix"] == prefix
    assert config["routing"]["logical_models"] == ["auto"]


def test_the_worker_alone_is_the_first_worker_unless_the_pool_says():
    assert pool().direct_target() == Direct(WORKERS[0])
    pinned = Direct("http://127.0.0.1:9", ((WORKER_HEADER, "7"),), fresh_connections=True)
    assert pool(direct=lambda: pinned).direct_target() == pinned


def test_engines_with_the_tiny_tokenizer_get_a_shorter_trace_text():
    _, trace = shapes(Settings(), pool(trace_words_per_block=4).trace_words_per_block)
    assert trace.block_size == 4
    assert shapes(Settings())[1].block_size == 16


def test_a_vllm_reset_is_retried_until_the_server_has_freed_its_blocks():
    answers = {"http://a": [b'{"success":false}', b'{"success": false}', b'{"success":true}'],
               "http://b": [b'{"success":true}']}
    asked = []

    def post(url: str) -> bytes:
        asked.append(url)
        return answers[url.removesuffix("/reset_prefix_cache")].pop(0)

    reset_prefix_caches(["http://a", "http://b"], post=post)
    assert asked == ["http://a/reset_prefix_cache"] * 3 + ["http://b/reset_prefix_cache"]
    with pytest.raises(RuntimeError, match="refused to reset"):
        reset_prefix_caches(["http://c"], timeout_s=0.0, post=lambda url: b'{"success":false}')


def test_the_backends_are_wired_in():
    assert isinstance(BACKENDS["vllm"](Settings(backend="vllm")), VllmBackend)
    assert isinstance(BACKENDS["dynamo"](Settings(backend="dynamo")), DynamoBackend)
    assert VllmBackend().kv_tokens == DynamoBackend().kv_tokens == 16384


def test_over_dynamo_the_standard_set_is_saar_beside_dynamos_own_routers():
    backend = DynamoBackend()
    routers = backend.routers(ROUTERS)
    assert tuple(r.name for r in routers) == DYNAMO_ROUTERS
    saar, kv, affinity = routers
    assert isinstance(saar, SaarOverDynamo)
    assert isinstance(kv, DynamoKvRouter) and kv.frontend_args == ()
    assert isinstance(affinity, DynamoKvRouter)
    assert affinity.frontend_args == ("--router-session-affinity-ttl-secs", str(AFFINITY_TTL_S))
    chosen = backend.routers(["dynamo:kv", "saar", "vllm-router:round_robin"])
    assert [r.name for r in chosen] == ["dynamo:kv", "saar", "vllm-router:round_robin"]
    assert isinstance(chosen[2], PeerRouter)  # over the worker slots
    with pytest.raises(ValueError, match="dynamo:kv_affinity"):
        backend.routers(["dynamo:round_robin"])
    with pytest.raises(RuntimeError, match="not running"):
        backend.running()


def test_a_slot_names_its_worker_and_answers_an_empty_metrics_page(tmp_path):
    routes = slot_routes(1, 123)["resources"]
    assert [r["name"] for r in routes] == ["worker_1"]
    metrics, forward = routes[0]["virtual_hosts"][0]["routes"]
    assert metrics["match"] == {"path": "/metrics"}
    assert metrics["direct_response"]["status"] == 200
    assert forward["route"]["cluster"] == "frontend"
    assert forward["request_headers_to_add"][0]["header"] == {"key": WORKER_HEADER,
                                                              "value": "123"}
    files = [tmp_path / "a.yaml", tmp_path / "b.yaml"]
    boot = slots_bootstrap([1001, 1002], 2000, 3000, files)
    assert boot["node"]["id"]  # file-based RDS needs one
    listeners = boot["static_resources"]["listeners"]
    assert [ln["address"]["socket_address"]["port_value"] for ln in listeners] == [1001, 1002]
    sources = [ln["filter_chains"][0]["filters"][0]["typed_config"]["rds"] for ln in listeners]
    assert [s["config_source"]["path_config_source"]["path"] for s in sources] == [
        str(f) for f in files]
    cluster = boot["static_resources"]["clusters"][0]
    options = cluster["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert options["common_http_protocol_options"] == {"max_requests_per_connection": 1}


@pytest.fixture
def frontend() -> Iterator[int]:
    """A stand-in for Dynamo's frontend: answers with the worker header it was sent."""
    started = threading.Event()
    port: list[int] = []
    loop = asyncio.new_event_loop()

    async def echo(request: web.Request) -> web.Response:
        return web.Response(text=request.headers.get(WORKER_HEADER, "none"))

    async def serve() -> web.AppRunner:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", echo)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(serve())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(10)
    yield port[0]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


@pytest.mark.e2e
def test_the_slots_follow_the_workers_new_ids_without_closing(tmp_path: Path, frontend: int):
    slots = WorkerSlots(tmp_path, 2, frontend)
    try:
        slots.point([11, 22])
        assert [_get(f"{url}/v1/models") for url in slots.urls] == ["11", "22"]
        assert _get(f"{slots.urls[0]}/metrics").startswith("#")
        assert slots.pids()
        slots.point([33, 44])  # the workers restarted: same slots, new ids
        assert [_get(f"{url}/v1/models") for url in slots.urls] == ["33", "44"]
    finally:
        slots.close()
    assert slots.pids() == []
