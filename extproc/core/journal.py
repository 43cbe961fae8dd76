"""What the core tells observability about each request, as typed facts.

The core decides; it does not write records. Each decision goes out as one ``Decided`` (every
fact a replay record, a what-if or a trace row is made of), each part of its outcome as an
``Outcome`` as it becomes known (the status and worker from the routing stream, what the answer
carried from whichever stream read it, the end of the stream), in either order. The service
gives the router a ``Journal`` that turns them into records (``observability.journal``); the
evaluation and the tests may give it another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..state.records import SessionRecord
from ..types import RequestSummary, ResponseSummary, SessionIdentity

if TYPE_CHECKING:
    from ..scheduling.placement import Placement
    from .saar import RoutingDecision


class Held(NamedTuple):
    """One wait of a request at the processor before it was routed (``perf_counter`` times):
    admission paused its session, its lock's model was out, its large body waited for its
    tenant's budget, its issuer's write was still on its way. They are not the router's time."""

    kind: str
    since: float
    until: float


@dataclass(frozen=True, slots=True)
class Timings:
    """Where one request's routing time went, in seconds, as the core measured it."""

    parse: float
    identity: float
    load: float
    """Between ``read`` and ``route``: the facts loaded from the state layer."""
    saar: float
    scheduling: float
    plugins: Mapping[str, float] = field(default_factory=dict)
    """The scheduler's timing of each of its plugins, in the order they ran."""
    held: float = 0.0
    """Seconds the request waited at the processor (its holds), taken out of ``load``."""


@dataclass(frozen=True, slots=True)
class Decided:
    """One routing decision and everything it was made from (content-free)."""

    replay_id: str
    time: float
    request: RequestSummary
    identity: SessionIdentity
    decision: RoutingDecision
    placement: Placement
    state: SessionRecord | None
    """The session's record as the decision saw it."""
    timings: Timings | None = None
    traceparent: str | None = None
    cached: Mapping[str, int | None] = field(default_factory=dict)
    """Tokens SAAR's pricing measured cached on each model's best worker."""
    holds: tuple[Held, ...] = ()


@dataclass(frozen=True, slots=True)
class Outcome:
    """A part of a request's outcome; the fields the reporting stream knows, the rest None."""

    status: int | None = None
    served: str | None = None
    """The worker Envoy really used (with ``status``)."""
    response: ResponseSummary | None = None
    """What the answer carried, once read."""
    aborted: bool = False
    """The stream ended before any response headers: the client hung up."""
    latency_ms: float | None = None
    """Set when the routing stream ends."""
    first_chunk_ms: float | None = None
    """A streamed answer's first event passed, this long after the request started (its
    time to first token)."""
    refused: str | None = None
    """The error code of a decision answered with a refusal."""
    retry_after: int | None = None


class Journal(Protocol):
    def decided(self, entry: Decided) -> None:
        """A decision was made (before its answer)."""

    def completed(self, replay_id: str, outcome: Outcome) -> None:
        """A part of the outcome of ``replay_id`` became known."""


class NoJournal:
    """Records nothing: for tools that only want the decisions."""

    def decided(self, entry: Decided) -> None:
        return None

    def completed(self, replay_id: str, outcome: Outcome) -> None:
        return None
