"""One ext_proc stream, as a loop: decode each message into events, hand them to the
exchange, run the commands it gives back, and send its replies.

The loop does every piece of I/O a request needs and decides nothing: loading facts from the
state layer, parsing a large body on the parse thread, writing what the exchange says to write
(here at once, to a shared store soon), holding a message (Envoy is told to wait longer) until
the waker wakes it, waking other requests. Only one thing runs beside the stream: the early
load of a session's facts, started at the request headers while Envoy buffers the body, and
awaited when the exchange has nothing else to go on.

How the three kinds of stream use the exchange — the routing stream, a gateway's endpoint
picker stream (full duplex), the observe stream of a streamed answer — is the exchange's story
(``core.exchange``); the messages and replies are the codec's (``adapter.codec``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from ..core import exchange as ex
from ..errors import RoutingError
from ..observability import logs
from ..observability.metrics import Metrics
from ..state.layer import StateLayer
from ..state.records import Turn
from ..state.store import Facts
from .codec import Decoder, Routing, error_response, hold_reply, replies
from .gate import ParseThread
from .waker import Waker

log = logging.getLogger(__name__)
_REPLIES = (ex.Continue, ex.Route, ex.Chunk, ex.Refuse)


@dataclass(frozen=True, slots=True)
class Io:
    """What the loop does I/O with, one per process (the assembly makes it)."""

    state: StateLayer
    waker: Waker
    metrics: Metrics
    routing: Routing
    parser: ParseThread | None = None


class Stream:
    """One ext_proc stream (one HTTP request seen by one filter)."""

    def __init__(self, exchange: ex.Exchange, io: Io, *, rendered: bool = False) -> None:
        """``rendered``: Envoy renders the diagnostics from the metadata (its filter said so)."""
        self._exchange = exchange
        self._io = io
        self._routing = io.routing.rendered() if rendered else io.routing
        self._decoder = Decoder()
        self._early: asyncio.Task[Facts] | None = None
        logs.open_request()  # this task's log lines name the request (``observability.logs``)
        self.done = False
        """An observe stream has nothing left to learn: the servicer ends it."""

    @property
    def style(self) -> str:
        return self._exchange.style

    @property
    def closing(self) -> bool:
        return self._exchange.closing

    async def replies(
        self, message: ep.ProcessingRequest
    ) -> AsyncIterator[ep.ProcessingResponse]:
        """The replies to one message, as they are made (none: Envoy expects none yet)."""
        sent = False
        for event in self._decoder.events(message):
            if isinstance(event, ex.Observe) and event.turn is not None:
                logs.tag(event.turn.replay_id, _session_id(event.turn))
            async for reply in self._run(self._exchange.handle(event)):
                sent = True
                yield reply
        while not sent and self._early is not None and self._exchange.stage is ex.Stage.DECIDE:
            # Nothing else moves the request on: the early load's facts must come in.
            facts = await self._collect()
            async for reply in self._run(self._exchange.handle(ex.Loaded(facts, True))):
                sent = True
                yield reply

    def close(self) -> None:
        """The stream ended: the exchange ends its turn (its last writes are sent, not
        awaited: nobody waits for this stream any more)."""
        if self._early is not None:
            self._early.cancel()
            self._early = None
        for command in self._exchange.handle(ex.Closed()):
            if isinstance(command, ex.Apply):
                self._io.state.send(command.writes)
                self._io.waker.applied(command.writes)
            elif isinstance(command, ex.Wake):
                self._io.waker.wake(command.kind, command.key)

    async def _collect(self) -> Facts:
        early, self._early = self._early, None
        assert early is not None
        try:
            return await early
        except Exception:  # the state layer serves what it can; an empty load re-asks
            return Facts(None, None)

    async def _run(self, commands: list[ex.Command]) -> AsyncIterator[ep.ProcessingResponse]:
        """Run ``commands`` in order, yielding Envoy's replies; what they bring back (facts, a
        parse, a wake-up) goes to the exchange, whose further commands run in turn."""
        io = self._io
        queue = commands
        while queue:
            command = queue.pop(0)
            if isinstance(command, _REPLIES):
                if isinstance(command, ex.Route | ex.Refuse) and log.isEnabledFor(logging.DEBUG):
                    _told(command)
                for reply in replies(command, self._routing):
                    yield reply
            elif isinstance(command, ex.Apply):
                if command.wait:
                    await io.state.apply(command.writes)
                else:
                    io.state.send(command.writes)
                io.waker.applied(command.writes)
            elif isinstance(command, ex.Load):
                if command.early:
                    self._early = io.state.prefetch(command.query)
                    if self._early is None:
                        queue[:0] = self._exchange.handle(
                            ex.Loaded(io.state.local.load_now(command.query), True))
                    continue
                facts = await io.state.load(command.query)
                queue[:0] = self._exchange.handle(ex.Loaded(facts))
            elif isinstance(command, ex.Parse):
                parsed = await self._parse(command)
                if parsed.request is not None:
                    logs.tag(session=parsed.request.identity.session_id)
                queue[:0] = self._exchange.handle(parsed)
            elif isinstance(command, ex.Hold):
                yield hold_reply(command.timeout)  # Envoy waits this much longer
                late = await io.waker.wait(command.kind, command.key, command.timeout,
                                           command.due)
                io.metrics.holds.labels(command.kind, "timeout" if late else "ready").inc()
                queue[:0] = self._exchange.handle(ex.Woken(command.kind, late))
            elif isinstance(command, ex.Wake):
                io.waker.wake(command.kind, command.key)
            elif isinstance(command, ex.Done):
                self.done = True

    async def _parse(self, command: ex.Parse) -> ex.Parsed:
        parser = self._io.parser
        try:
            if command.offload and parser is not None:
                return ex.Parsed(await parser.run(command.job))
            return ex.Parsed(command.job())
        except RoutingError as exc:
            return ex.Parsed(None, exc)


def _told(command: ex.Route | ex.Refuse) -> None:
    """One debug line a decision (its replay id and session ride along as tags)."""
    if isinstance(command, ex.Refuse):
        log.debug("refused: %s %s", command.error.status, command.error.code)
        return
    routed = command.routed
    log.debug("routed to %s (decision %s, %s), worker %s", routed.model, routed.turn.decision,
              routed.turn.phase.value, routed.placement.worker or "left to Envoy")


def _session_id(turn: Turn) -> str | None:
    """The session's id as its client named it (the turn carries it scoped by tenant)."""
    key, scope = turn.session_key, f"{turn.tenant}/"
    return key[len(scope):] if key is not None and key.startswith(scope) else key


async def process(
    stream: Stream, requests: AsyncIterator[ep.ProcessingRequest], metrics: Metrics
) -> AsyncIterator[ep.ProcessingResponse]:
    """The servicer's loop around one stream: never lets a stream crash. It times what the
    processor added to the request (``saar_router_overhead_seconds``): from each message to
    its first reply, summed over a routing stream (a hold's reply ends its message's time;
    observe streams, which Envoy never waits on, are not timed)."""
    overhead, routing = 0.0, True
    reader = aiter(requests)
    try:
        while True:
            try:
                message = await (_shielded(reader) if stream.closing else anext(reader))
            except StopAsyncIteration:
                break
            since: float | None = time.perf_counter()
            routing = routing and not message.observability_mode
            try:
                async for reply in stream.replies(message):
                    if since is not None:
                        overhead += time.perf_counter() - since
                        since = None
                    yield reply
            except Exception:
                log.exception("ext_proc message failed")
                metrics.stream_failures.inc()
                if not message.observability_mode:
                    yield error_response(
                        RoutingError("the router failed on this request; see its logs"),
                        stream.style)
            if stream.done:
                return
    finally:
        stream.close()
        if routing and overhead:
            metrics.overhead_seconds.observe(overhead)


async def _shielded(reader: AsyncIterator[ep.ProcessingRequest]) -> ep.ProcessingRequest:
    """The read Envoy's end lands on (its half-close and reset come together), run where the
    reset's cancellation cannot reach it. A read cancelled while its batch is in flight leaks
    the batch's ops in ``grpc.aio`` (grpc/grpc#43360) for every request whose reset won that
    race: the soak's residual creep (about 50 bytes a request on average, measured).
    Shielded, the read still completes (the half-close) and frees them; the handler is
    cancelled as before."""
    read = asyncio.ensure_future(anext(reader))
    read.add_done_callback(_taken)
    return await asyncio.shield(read)


def _taken(read: asyncio.Future[ep.ProcessingRequest]) -> None:
    """A shielded read that ends after its handler (on the half-close, or the stream's error)
    has its end taken here: asyncio would log every one as never retrieved."""
    if not read.cancelled():
        read.exception()
