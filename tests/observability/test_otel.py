"""OpenTelemetry, opt-in: spans of routed requests reach an in-process OTLP/gRPC receiver and
continue the client's traceparent; when off, nothing of OpenTelemetry is even imported."""

from __future__ import annotations

import subprocess
import sys
from concurrent import futures
from dataclasses import replace

import grpc
import orjson
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from extproc.assembly import assemble
from extproc.config import Otlp
from extproc.core.router import LocalDriver
from extproc.service.telemetry import Telemetry
from extproc.types import Api, ResponseSummary

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
BODY = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "refactor it"}]})


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace endpoint that keeps what it is sent."""

    def __init__(self) -> None:
        self.spans: list = []

    def Export(self, request, context):
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                self.spans.extend(scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def receiver():
    found = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(found, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield found, port
    server.stop(None)


def _traced(config, port: int):
    """The example config with OTLP on and a pool of two workers (so scheduling runs)."""
    model = config.models["qwen3-32b"]
    models = {**config.models,
              "qwen3-32b": replace(model, endpoints=("127.0.0.1:8102", "127.0.0.1:8103"))}
    otlp = Otlp(enabled=True, endpoint=f"http://127.0.0.1:{port}", service_name="saar-test")
    return replace(config, models=models,
                   observability=replace(config.observability, otlp=otlp))


async def test_a_routed_request_is_a_span_tree_in_the_clients_trace(config, receiver):
    found, port = receiver
    config = _traced(config, port)
    parts = assemble(config)
    telemetry = Telemetry.start(config, parts)
    driver = LocalDriver(parts.router)
    headers = {"x-session-id": "otel", "authorization": "Bearer k"}
    traced = driver.route(Api.CHAT, {**headers, "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"},
                          BODY)
    driver.respond(traced, ResponseSummary(status=200, finish_reason="stop"))
    fresh = driver.route(Api.CHAT, headers, BODY)
    unsampled = driver.route(
        Api.CHAT, {**headers, "traceparent": f"00-{'1' * 32}-{'2' * 16}-00"}, BODY)
    await telemetry.stop()  # flushes the exporter
    by_trace: dict[str, list] = {}
    for span in found.spans:
        by_trace.setdefault(span.trace_id.hex(), []).append(span)
    assert set(by_trace) >= {TRACE_ID}
    assert "1" * 32 not in by_trace, "the client did not sample that trace"
    spans = {s.name: s for s in by_trace[TRACE_ID]}
    root = spans["saar.route"]
    assert root.parent_span_id.hex() == CLIENT_SPAN
    attributes = {a.key: a.value.string_value or a.value.int_value for a in root.attributes}
    assert attributes["saar.replay_id"] == traced.replay_id
    assert attributes["saar.model"] == traced.model
    for name in ("saar.parse", "saar.identity", "saar.state.load", "saar.policy",
                 "saar.scheduling"):
        assert spans[name].parent_span_id == root.span_id, name
    scheduling = spans["saar.scheduling"]
    plugins = {s.name.removeprefix("saar.scheduling."): s for s in by_trace[TRACE_ID]
               if s.parent_span_id == scheduling.span_id}
    assert set(config.scheduling.scorers) <= set(plugins), "one span per scorer"
    assert {"healthy", "picker"} <= set(plugins)
    for span in by_trace[TRACE_ID]:
        assert root.start_time_unix_nano <= span.start_time_unix_nano
        assert span.end_time_unix_nano <= root.end_time_unix_nano
        assert span.start_time_unix_nano <= span.end_time_unix_nano
    roots = [s for spans in by_trace.values() for s in spans if s.name == "saar.route"]
    others = [s for s in roots if s.trace_id.hex() != TRACE_ID]
    assert len(others) == 1 and not others[0].parent_span_id, "a new trace of its own"
    assert fresh.replay_id != unsampled.replay_id


def test_nothing_of_opentelemetry_is_imported_when_it_is_off():
    code = """
import asyncio, sys
from dataclasses import replace
from extproc.config import load_config
from extproc.service.app import start

async def main():
    config = load_config("config/example.yaml")
    service = await start(replace(config, server=replace(config.server, grpc_port=0,
                                                         http_port=0)))
    await service.stop()

asyncio.run(main())
print(",".join(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    from tests.conftest import ROOT

    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""
