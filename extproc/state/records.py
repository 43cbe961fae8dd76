"""What the router remembers, as plain records, and the writes that change them.

One ``SessionRecord`` per session holds every per-session fact a routing decision reads: the
model and decision it is on, where its turns stand, its cache evidence and the worker that
holds its KV (the binding). One ``Owner`` per id says which model and worker issued a tool-call
id, a response id or a provider-state fingerprint, and which session got it.

Writes are deltas, not snapshots: ``Commit`` (a turn the upstream accepted), ``Finish`` (the
answer ended: what it carried), ``Claim`` (ids a model now owns) and ``Forget`` (the session
ended). ``commit`` and ``finish`` are the one implementation of how a delta lands on a record;
every store applies them (the Redis store with a compare-and-set around them), so two replicas
racing on a session, a write replayed after an outage, or the routing and observe streams of one
turn arriving in either order all end in the same record. Both are idempotent per replay id.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import orjson

from ..types import Phase, Usage

SWITCH_TIMES_KEPT = 16
ISSUED_KEPT = 64
RECENT_TURNS_KEPT = 8
"""Replay ids of the last committed turns a record remembers, so a commit arriving twice (the
routing stream and the observer, a write-back after an outage) lands once."""


@dataclass(slots=True)
class SessionRecord:
    model: str
    decision: str
    phase: Phase
    last_seen: float
    worker: str | None = None
    """The worker that served the last committed turn: its KV holds the session."""
    turns: int = 0
    switches: int = 0
    switch_times: tuple[float, ...] = ()
    context_tokens: int = 0
    estimated_reuse_tokens: int = 0
    reported_prompt_tokens: int = 0
    reported_cached_tokens: int = 0
    last_replay_id: str | None = None
    recent: tuple[str, ...] = ()
    issued: tuple[str, ...] = ()
    """Ids the last answer issued (tool calls, its response, provider state), owned by this
    record's model on ``issued_worker``: a request continuing them needs no owner lookup."""
    issued_worker: str | None = None
    last_started: float = 0.0
    """When the newest committed turn was routed: an older turn arriving later (a write sent
    again after an outage, parallel requests answered out of order) is counted but never
    overwrites what the newer one set."""
    version: int = 0
    """Bumped by every write; the Redis store's compare-and-set compares it."""
    parent: str | None = None
    """The session this one is a sub-agent of (its id, in the same tenant), as its first
    turn found it: a later request that names no session (Qwen Code) finds it here."""
    requested: str | None = None
    """The model its latest request that was not light named (the session's usual model,
    ``core.side``); None while it has made only light requests."""

    @property
    def reported_cache_ratio(self) -> float | None:
        """The backend's own cache evidence for the last turn, kept apart from our estimate."""
        if self.reported_prompt_tokens <= 0:
            return None
        return self.reported_cached_tokens / self.reported_prompt_tokens

    def copy(self) -> SessionRecord:
        """Every field (spelt out: ``dataclasses.replace`` costs ten times as much, and a
        record is copied on every load and write; its sequences are tuples, shared)."""
        return SessionRecord(
            self.model, self.decision, self.phase, self.last_seen, self.worker, self.turns,
            self.switches, self.switch_times, self.context_tokens,
            self.estimated_reuse_tokens, self.reported_prompt_tokens,
            self.reported_cached_tokens, self.last_replay_id, self.recent,
            self.issued, self.issued_worker, self.last_started, self.version, self.parent,
            self.requested,
        )


@dataclass(frozen=True, slots=True)
class Owner:
    """Who issued an id: the model (the lock), its worker (the pin) and the session it went to."""

    model: str
    worker: str | None = None
    session: str | None = None


@dataclass(frozen=True, slots=True)
class Turn:
    """One routed request, as a commit will write it. It travels with the request (Envoy
    forwards it to the observe stream as metadata), so any replica can complete it."""

    replay_id: str
    session_key: str | None
    tenant: str
    model: str
    decision: str
    phase: Phase
    switched: bool
    context_tokens: int
    started: float
    worker: str | None = None
    """The picked worker; the commit replaces it by the one Envoy really used, when known."""
    final: bool = False
    parent: str | None = None
    """The session's parent (``SessionRecord.parent``)."""
    requested: str | None = None
    """The model the request named, unless it was light (``SessionRecord.requested``)."""
    restart: bool = False
    """The main loop's first request after only light ones (``core.side``): the session's
    record starts afresh with this turn."""

    def to_wire(self) -> str:
        """A metadata string value (JSON)."""
        return orjson.dumps(
            [self.replay_id, self.session_key, self.tenant, self.model, self.decision,
             self.phase.value, self.switched, self.context_tokens, self.started, self.worker,
             self.final, self.parent, self.requested, self.restart]
        ).decode()

    @classmethod
    def from_wire(cls, data: str) -> Turn:
        """Raises ``ValueError`` on anything but what ``to_wire`` wrote (or, without its last
        three fields, what a replica of the version before wrote)."""
        try:
            (replay_id, session_key, tenant, model, decision, phase, switched, tokens, started,
             worker, final, *later) = orjson.loads(data)
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            raise ValueError(f"not a turn: {exc}") from None
        if len(later) not in (0, 3):
            raise ValueError(f"not a turn: {len(later)} fields past the eleventh")
        return cls(replay_id, session_key, tenant, model, decision, Phase(phase), switched,
                   tokens, started, worker, final, *later)


@dataclass(frozen=True, slots=True)
class Commit:
    turn: Turn


@dataclass(frozen=True, slots=True)
class Finish:
    """The answer of ``turn`` ended (and was a success): commits the turn if nothing has yet."""

    turn: Turn
    tool_calls: bool = False
    usage: Usage | None = None
    issued: tuple[str, ...] = ()
    """The bare ids the answer issued (the record keeps the last answer's)."""


@dataclass(frozen=True, slots=True)
class Claim:
    keys: tuple[str, ...]
    """Tenant-scoped id keys (``owner_key``)."""
    owner: Owner


@dataclass(frozen=True, slots=True)
class Forget:
    session_key: str


Write = Commit | Finish | Claim | Forget


def owner_key(tenant: str, value: str) -> str:
    """Ids are owned per tenant: another tenant sending the same id learns nothing."""
    return f"{tenant}/{value}"


def commit(
    record: SessionRecord | None, turn: Turn, now: float, *, rebind: bool = True
) -> tuple[SessionRecord, bool]:
    """``record`` with ``turn`` written; True when this write moved the session to another
    model (a switch, counted once however often the commit arrives). A repeated commit only
    ``rebind``s the session to the turn's worker: the routing stream learns the worker Envoy
    really used, possibly after the observer committed with the picked one."""
    if record is not None and turn.replay_id in record.recent:
        if rebind and record.last_replay_id == turn.replay_id and turn.worker:
            record.worker = turn.worker
        return record, False
    if record is None:
        record = SessionRecord(turn.model, turn.decision, turn.phase, now, parent=turn.parent)
    elif turn.restart:  # the light turns before it are forgotten, not their replay ids
        record = SessionRecord(turn.model, turn.decision, turn.phase, now, recent=record.recent,
                               version=record.version, parent=turn.parent or record.parent)
    elif turn.started < record.last_started:
        record.turns += 1
        record.recent = (*record.recent[-(RECENT_TURNS_KEPT - 1):], turn.replay_id)
        return record, False
    moved = turn.switched and record.model != turn.model
    if moved:
        record.switches += 1
        record.switch_times = (*record.switch_times[-(SWITCH_TIMES_KEPT - 1):], turn.started)
        record.estimated_reuse_tokens = 0
    else:
        record.estimated_reuse_tokens = record.context_tokens
    record.model = turn.model
    record.decision = turn.decision
    record.phase = turn.phase
    record.worker = turn.worker or (record.worker if not moved else None)
    record.turns += 1
    record.last_seen = now
    record.context_tokens = turn.context_tokens
    record.last_replay_id = turn.replay_id
    record.last_started = turn.started
    record.recent = (*record.recent[-(RECENT_TURNS_KEPT - 1):], turn.replay_id)
    record.issued, record.issued_worker = (), None  # answered, or left behind by this turn
    record.requested = turn.requested or record.requested
    return record, moved


def finish(
    record: SessionRecord | None, done: Finish, now: float
) -> tuple[SessionRecord, bool]:
    """``record`` after the answer of ``done.turn``: committed if it was not, then the session
    is in a tool loop while the answer called tools, and keeps the backend's usage. An answer
    that a later turn already overtook changes nothing but the commit."""
    record, moved = commit(record, done.turn, now, rebind=False)
    if record.last_replay_id != done.turn.replay_id:
        return record, moved
    record.last_seen = now
    if done.tool_calls:
        record.phase = Phase.TOOL_LOOP
    elif record.phase is Phase.TOOL_LOOP:
        record.phase = Phase.NORMAL
    record.issued = tuple(done.issued[:ISSUED_KEPT])
    record.issued_worker = done.turn.worker
    usage = done.usage
    if usage is not None:
        record.reported_prompt_tokens = usage.prompt_tokens
        record.reported_cached_tokens = usage.cached_tokens
        record.context_tokens = max(
            record.context_tokens, usage.prompt_tokens + usage.completion_tokens
        )
    return record, moved


def apply(
    record: SessionRecord | None, write: Commit | Finish, now: float
) -> tuple[SessionRecord, bool]:
    """One session write on ``record`` (a copy: the caller's record is left as it was)."""
    base = None if record is None else record.copy()
    if isinstance(write, Commit):
        return commit(base, write.turn, now)
    return finish(base, write, now)


def session_of(write: Write) -> str | None:
    """The session a write changes (None: it changes owners only)."""
    if isinstance(write, Commit | Finish):
        return write.turn.session_key
    if isinstance(write, Forget):
        return write.session_key
    return None


# -- the wire form the Redis store keeps ----------------------------------------------------


def pack_record(record: SessionRecord) -> bytes:
    return msgpack.packb(
        [record.model, record.decision, record.phase.value, record.last_seen, record.worker,
         record.turns, record.switches, record.switch_times, record.context_tokens,
         record.estimated_reuse_tokens, record.reported_prompt_tokens,
         record.reported_cached_tokens, record.last_replay_id, record.recent, record.issued,
         record.issued_worker, record.last_started, record.parent, record.requested]
    )


def unpack_record(data: bytes, version: int) -> SessionRecord:
    """A record ``pack_record`` wrote (or, without its last two fields, the version before
    wrote)."""
    (model, decision, phase, last_seen, worker, turns, switches, switch_times, context,
     reuse, prompt, cached, last_replay_id, recent, issued, issued_worker,
     last_started, *later) = msgpack.unpackb(data)
    return SessionRecord(model, decision, Phase(phase), last_seen, worker, turns, switches,
                         tuple(switch_times), context, reuse, prompt, cached, last_replay_id,
                         tuple(recent), tuple(issued), issued_worker, last_started, version,
                         *later[:2])


OWNER_SEPARATOR = "\x00"
"""Between the session key, model and worker of an owner: no header value or model name can
hold a NUL (identity hashes any id that does), and the Redis load script splits on it."""


def pack_owner(owner: Owner) -> bytes:
    return OWNER_SEPARATOR.join((owner.session or "", owner.model, owner.worker or "")).encode()


def unpack_owner(data: bytes) -> Owner:
    session, model, worker = data.decode().split(OWNER_SEPARATOR)
    return Owner(model, worker or None, session or None)
