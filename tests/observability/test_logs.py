"""Log lines (issue 32): text or JSON (``logging.format``), at ``logging.level``, and every line
about a request naming its replay id and session, through the real adapter and exchange."""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import logging
from collections.abc import Iterator

import pytest

from extproc.assembly import assemble
from extproc.observability import logs
from tests.adapter.support import (
    BODY,
    CHAT,
    Replica,
    body_msg,
    headers_msg,
    saar_metadata,
    two_workers,
)


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """What the root logger writes in JSON mode, the router's loggers at debug."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(logs.RequestFilter())
    root, ours = logging.getLogger(), logging.getLogger("extproc")
    level = ours.level
    root.addHandler(handler)
    ours.setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        ours.setLevel(level)


def _lines(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


class Boom:
    """A scoring plugin that fails: the scheduler contains it and logs it, mid-request."""

    name = "boom"

    def score(self, request: object, workers: object) -> dict[str, float]:
        raise RuntimeError("boom")


async def _routed(replica: Replica, session: str) -> str:
    stream = replica.stream()
    await stream.handle(headers_msg({**CHAT, "x-session-id": session}))
    return saar_metadata(await stream.handle(body_msg(BODY)))["replay_id"]


async def test_a_line_logged_while_a_request_is_routed_names_its_replay_id_and_session(
        config, clock, json_lines):
    parts = assemble(two_workers(config), clock=clock)  # two workers: the scheduler picks
    scheduler = parts.pools.scheduler
    scheduler.scorers = ((Boom(), 1.0), *scheduler.scorers)
    replica = Replica(parts)
    replay_id = await asyncio.create_task(_routed(replica, "s-logs"))
    logging.getLogger("extproc.test").warning("after the request")
    lines = _lines(json_lines)
    failed = next(line for line in lines if line["message"].startswith("scheduling plugin boom"))
    assert failed["level"] == "ERROR"
    assert failed["logger"] == "extproc.scheduling.scheduler"
    assert (failed["replay_id"], failed["session"]) == (replay_id, "s-logs")
    assert "RuntimeError: boom" in failed["exception"]
    assert failed["time"].endswith("Z")
    routed = next(line for line in lines if line["message"].startswith("routed to"))
    assert (routed["replay_id"], routed["session"]) == (replay_id, "s-logs")
    assert routed["message"].startswith(
        "routed to qwen3-32b (decision hard_engineering, new), worker 10.0.0.")
    after = lines[-1]
    assert after["message"] == "after the request" and "replay_id" not in after


async def test_streams_side_by_side_keep_their_own_names(config, clock, json_lines):
    parts = assemble(two_workers(config), clock=clock)
    scheduler = parts.pools.scheduler
    scheduler.scorers = ((Boom(), 1.0), *scheduler.scorers)
    replica = Replica(parts)
    ids = await asyncio.gather(*(asyncio.create_task(_routed(replica, f"s-{n}"))
                                 for n in range(4)))
    named = {(line["replay_id"], line["session"]) for line in _lines(json_lines)
             if line["message"].startswith("scheduling plugin boom")}
    assert named == {(replay_id, f"s-{n}") for n, replay_id in enumerate(ids)}


def test_outside_a_stream_nothing_is_tagged():
    """The command-line tools, the simulators: no stream, nothing to name."""
    context = contextvars.Context()
    context.run(logs.tag, "rp-x", "s")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    context.run(logs.RequestFilter().filter, record)
    assert (record.replay_id, record.session) == (None, None)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("form", "expected"), [
    ("text", "WARNING extproc.x: careful replay_id=rp-1 session=s-1"),
    ("json", '"level": "WARNING", "logger": "extproc.x", "message": "careful", '
             '"replay_id": "rp-1", "session": "s-1"}'),
])
def test_configure_sets_the_format_and_the_level(form, expected):
    root = logging.Logger("test-root")
    out = io.StringIO()
    root.addHandler(logging.StreamHandler(out))
    logs.configure("warning", form, root=root)
    assert root.level == logging.WARNING
    child = logging.Logger("extproc.x")
    child.parent = root

    async def about_a_request() -> None:
        logs.open_request()
        logs.tag("rp-1", "s-1")
        child.info("not written")
        child.warning("careful")

    asyncio.run(about_a_request())
    (line,) = out.getvalue().splitlines()
    assert line.endswith(expected), line
    logs.configure("debug", "text", root=root)  # again (SIGHUP): one filter, the new level
    assert root.level == logging.DEBUG
    assert len(root.handlers[0].filters) == 1


def test_a_traceback_follows_the_tags_in_text():
    formatter = logs.TextFormatter()
    try:
        raise ValueError("bad")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None,
                                   sys.exc_info())
    record.replay_id, record.session = "rp-2", None
    first, *rest = formatter.format(record).splitlines()
    assert first.endswith("ERROR x: failed replay_id=rp-2")
    assert rest[-1] == "ValueError: bad"
