"""The Chrome trace-event document, from records made up to the edge cases: sub-agents of
sub-agents, a child whose parent routed nothing here, requests without a session, an error."""

from __future__ import annotations

from extproc.observability.timeline import timeline


def turn(n: int, time: float, session: str | None, parent: str | None = None, *,
         latency_ms: float = 100.0, status: int = 200, stream: bool = False,
         headers_ms: float | None = None, outcome_first: float | None = None, tools: int = 0,
         **extra) -> dict:
    return {
        "replay_id": f"rp-{n}", "time": time, "model": "m", "action": "keep", "reason": "r",
        "session": {"id": session, "tenant": "t", "parent": parent},
        "request": {"stream": stream, "context_tokens": 10},
        "timings_us": {"parse": 10.0, "identity": 2.0, "load": 5.0, "saar": 20.0,
                       "scheduling": 13.0, "plugins": {}},
        "outcome": {"status": status, "latency_ms": latency_ms, "tool_calls": tools,
                    **({"headers_ms": headers_ms} if headers_ms is not None else {}),
                    **({"first_chunk_ms": outcome_first} if outcome_first is not None else {})},
        **extra,
    }


def test_sub_agents_nest_under_their_root_and_orphans_get_a_process():
    document = timeline([
        turn(1, 10.0, "root", tools=1),
        turn(2, 10.5, "child", "root"),
        turn(3, 10.7, "grandchild", "child"),
        turn(4, 11.0, "root"),
        turn(5, 12.0, "orphan", "gone"),
        turn(6, 12.5, None),
    ])
    events = document["traceEvents"]
    threads = {e["args"]["name"]: (e["pid"], e["tid"]) for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads["agent root"] == (1, 1)
    assert threads["sub-agent child (of root)"] == (1, 2)
    assert threads["sub-agent grandchild (of child)"] == (1, 3)
    assert threads["sub-agent orphan (of gone)"][0] not in (1,)
    assert "requests without a session" in threads
    assert document["otherData"] == {"origin_unix_s": 10.0, "sessions": 4}
    route = next(e for e in events if e.get("cat") == "route")
    assert route["dur"] == 50.0 and route["ts"] == -50.0
    tool = next(e for e in events if e.get("cat") == "tool")
    assert (tool["ts"], tool["dur"]) == (100_000.0, 900_000.0 - 50.0)
    assert tool["args"]["after"] == "rp-1"


def test_streamed_turns_split_into_ttft_and_decode_and_errors_are_marked():
    document = timeline([
        turn(1, 0.0, "s", stream=True, headers_ms=40.0, latency_ms=100.0),
        turn(2, 1.0, "s", status=503, previous_model="a", action="switch",
             holds=[{"kind": "paused", "ms": 812.5}]),
    ])
    events = document["traceEvents"]
    parts = {e["cat"]: (e["ts"], e["dur"]) for e in events if e.get("cat") in ("ttft", "decode")}
    assert parts == {"ttft": (0.0, 40_000.0), "decode": (40_000.0, 60_000.0)}
    first_token = timeline([turn(1, 0.0, "s", stream=True, headers_ms=5.0, latency_ms=100.0,
                                 outcome_first=70.0)])["traceEvents"]
    assert [(e["ts"], e["dur"]) for e in first_token if e.get("cat") == "ttft"] == [
        (0.0, 70_000.0)], "the first token's time, not the headers', when the record has it"
    marks = {e["name"]: e["args"] for e in events if e["ph"] == "i"}
    assert marks == {"switch a → m": {"replay_id": "rp-2", "reason": "r"},
                     "error": {"replay_id": "rp-2", "reason": "status 503"},
                     "held: paused": {"replay_id": "rp-2", "reason": "waited 812.5 ms at the "
                                      "processor (admission paused the session)"}}
    gaps = [e for e in events if e.get("cat") == "idle"]
    assert len(gaps) == 1, "no tools were called: the gap is the client's own"


def test_no_records_is_an_empty_trace():
    assert timeline([])["traceEvents"] == []
