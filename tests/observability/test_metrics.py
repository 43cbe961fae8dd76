"""Metrics with bounded labels (issue 9 item 9) and the figures derived from the records:
per-plugin latency and per-session duration, turns, tool time, switches and locked turns."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.assembly import assemble
from extproc.observability.figures import Figures
from extproc.observability.metrics import Metrics
from tests.conftest import FakeClock


def _headers(values: dict[str, str]) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=core.HeaderMap(
        headers=[core.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()])))


async def test_stripped_headers_are_counted_under_bounded_labels(config, clock):
    from tests.adapter.support import Replica

    replica = Replica(assemble(config, clock=clock))
    for request in range(50):
        junk = {f"x-saar-junk-{request}-{i}": "1" for i in range(80)}
        spoofed = {":method": "POST", ":path": "/v1/chat/completions", "x-saar-cluster": "evil",
                   "x-gateway-destination-endpoint": "10.0.0.1:80", **junk}
        reply = await replica.stream().handle(_headers(spoofed))
        assert len(reply.request_headers.response.header_mutation.remove_headers) == 82
    samples = [s for family in replica.parts.metrics.registry.collect()
               if family.name == "saar_stripped_headers" for s in family.samples
               if s.name.endswith("_total")]
    counts = {s.labels["header"]: s.value for s in samples}
    assert counts == {"x-saar-cluster": 50, "x-gateway-destination-endpoint": 50, "other": 4000}


def _record(n: int, time: float, *, session: str = "s", action: str = "keep",
            lock: str | None = None, final: bool = False) -> dict:
    return {"replay_id": f"rp-{n}", "time": time, "action": action, "lock": lock,
            "session": {"id": session, "tenant": "t", "final": final},
            "timings_us": {"plugins": {"prefix": 20.0, "queue": 5.0}}}


def _value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_session_figures_are_observed_when_the_session_ends():
    metrics, clock = Metrics(), FakeClock(0.0)
    figures = Figures(metrics, clock=clock, idle_seconds=60, max_sessions=2)
    turns = [_record(1, 0.0, action="new"), _record(2, 10.0, lock="tool_loop",
                                                     action="locked_keep"),
             _record(3, 30.0, action="switch")]
    latency = {"rp-1": 2000.0, "rp-2": 1000.0, "rp-3": 500.0}
    for turn in turns:
        figures.recorded(turn)
        turn["outcome"] = {"latency_ms": latency[turn["replay_id"]],
                           "tool_calls": 1 if turn["replay_id"] != "rp-3" else 0}
        figures.completed(turn)
    assert _value(metrics, "saar_session_turns_count") == 0, "the session is still live"
    # Tool time: 2 s answer then 8 s of tools; 1 s answer then 19 s of tools.
    assert _value(metrics, "saar_session_tool_seconds_count") == 2
    assert _value(metrics, "saar_session_tool_seconds_sum") == 8.0 + 19.0
    assert _value(metrics, "saar_scheduling_plugin_seconds_count", plugin="prefix") == 3
    clock.advance(30.5 + 61)
    figures.sweep()
    assert _value(metrics, "saar_session_turns_sum") == 3
    assert _value(metrics, "saar_session_switches_sum") == 1
    assert _value(metrics, "saar_session_locked_turns_sum") == 1
    assert _value(metrics, "saar_session_duration_seconds_sum") == 30.5


def test_a_final_request_ends_its_session_and_the_table_is_bounded():
    metrics = Metrics()
    figures = Figures(metrics, clock=FakeClock(0.0), idle_seconds=3600, max_sessions=2)
    done = _record(1, 0.0, session="sub", final=True)
    figures.recorded(done)
    done["outcome"] = {"latency_ms": 100.0}
    figures.completed(done)
    assert _value(metrics, "saar_session_turns_count") == 1
    for n, session in enumerate(("a", "b", "c")):
        figures.recorded(_record(10 + n, 1.0 + n, session=session))
    assert _value(metrics, "saar_session_turns_count") == 2, "the oldest of three made room"
