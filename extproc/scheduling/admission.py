"""Session-aware admission, the ThunderAgent scheduler as ported to Dynamo (REFERENCE section 4).

A program (an agent session) is REASONING while a turn is in flight and ACTING between turns
(the agent is running tools), and ACTIVE or PAUSED. Its weight is the KV its context occupies:
prompt + completion of its last turn plus a fixed buffer. Per worker, U = the active programs'
tokens (ACTING ones weighted) / the worker's KV capacity. Every tick, an oversubscribed worker
pauses its smallest ACTING programs (their KV can be evicted while their tools run; the next turn
is held), demotes everyone in the band just below, and a worker with room resumes its smallest
paused programs first (bin packing). No turn in flight is ever pre-empted: when only REASONING
programs are left to pause, the smallest is paused at its next tool boundary instead. While
anything is paused, a NEW session is held too and admitted only once every paused program has
resumed: otherwise room freed by an ending session goes to the next arrival and the paused ones
wait (and lose their cache) for minutes. A new session also waits while no worker has room for
it under ``admit_threshold``: admitting it only to pause someone later costs a re-prefill. Held
new sessions are admitted oldest first, each to the worker with the most room
(``preferred_worker``, which placement honours).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import Admission
from ..state.table import Entry, SessionTable
from ..types import Clock
from .types import Worker


@dataclass(slots=True)
class Program:
    """An agent session as admission sees it: its slot on the session table."""

    key: str
    worker: str
    tokens: int
    reasoning: bool
    last_seen: float
    paused_at: float | None = None
    pause_at_boundary: bool = False
    resumed: bool = False
    """Resumed (or admitted) and not yet started its next turn: that turn gets the resume
    priority."""
    target: str | None = None
    """A held new session's worker, where the tick reserved its room: placement puts it first
    until the first turn starts."""
    started: bool = True
    """False for a new session admitted from the hold: ``tokens`` is an estimate until its
    first turn starts, and the reservation lapses if that turn never comes."""


@dataclass(frozen=True, slots=True)
class AdmissionTick:
    """What one tick changed: the server wakes held requests of ``resumed`` sessions; KV hints
    demote the ``paused`` (also those paused at their tool boundary since the last tick) and
    release the ``forgotten`` (idle past the TTL, or pushed out by the bound)."""

    paused: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()
    forgotten: tuple[str, ...] = ()


class AdmissionController:
    def __init__(
        self,
        config: Admission,
        *,
        clock: Clock,
        idle_ttl_seconds: float = 3600.0,
        max_programs: int = 100_000,
        table: SessionTable | None = None,
    ) -> None:
        """Disabled, it keeps nothing; enabled, each session's program hangs on its entry of
        ``table`` (the process's session table, whose assembler calls ``left`` when a session
        leaves it) — or of a table of its own, of ``max_programs`` sessions living
        ``idle_ttl_seconds`` after their last turn, when none is given."""
        self.config = config
        self._clock = clock
        if table is None:
            table = SessionTable(max_sessions=max_programs, ttl_seconds=idle_ttl_seconds,
                                 clock=clock)
            table.leaving(self.left)
        self._table = table
        self._count = 0
        self._arrivals: dict[str, float] = {}
        """New sessions held, in arrival order (key -> when first held)."""
        self._capacity: dict[str, int] = {}
        self._demoted: set[str] = set()
        self._boundary: list[str] = []
        """Programs paused at their tool boundary since the last tick."""
        self._forgotten: list[str] = []
        """Programs that left with their session since the last tick."""

    def _program(self, key: str | None) -> Program | None:
        entry = self._table.get(key)
        return None if entry is None else entry.program

    def _programs(self) -> list[Program]:
        return [e.program for _, e in self._table.oldest() if e.program is not None]

    def left(self, key: str, entry: Entry) -> None:
        """The session left the table: its program goes (a table's leaving hook)."""
        if entry.program is not None:
            entry.program = None
            self._count -= 1
            self._forgotten.append(key)
        self._arrivals.pop(key, None)

    def turn_started(self, session_key: str | None, worker: str, prompt_tokens: int) -> None:
        """A turn was admitted to ``worker``: the program is REASONING and ACTIVE (admitting a
        held turn anyway, e.g. after the hold timed out, resumes it)."""
        if session_key is None or not self.config.enabled:
            return
        self._arrivals.pop(session_key, None)
        entry = self._table.touch(session_key)
        program = entry.program
        tokens = prompt_tokens + self.config.buffer_tokens
        if program is None:
            entry.program = Program(session_key, worker, tokens, True, self._clock())
            self._count += 1
            return
        program.worker, program.reasoning, program.last_seen = worker, True, self._clock()
        program.tokens = max(program.tokens, tokens) if program.started else tokens
        program.paused_at, program.resumed, program.started = None, False, True
        program.target = None

    def turn_finished(
        self, session_key: str | None, worker: str, prompt_tokens: int, completion_tokens: int
    ) -> None:
        """The response ended (a tool boundary): the program is ACTING, weighing what the
        response's usage says its context now is."""
        if session_key is None or not self.config.enabled:
            return
        now = self._clock()
        tokens = prompt_tokens + completion_tokens + self.config.buffer_tokens
        entry = self._table.touch(session_key)
        program = entry.program
        if program is None:
            program = entry.program = Program(session_key, worker, tokens, False, now)
            self._count += 1
        program.worker, program.tokens, program.reasoning, program.last_seen = (
            worker, tokens, False, now
        )
        if program.pause_at_boundary:
            program.pause_at_boundary, program.paused_at = False, now
            self._boundary.append(session_key)

    def release(self, session_key: str | None) -> None:
        """The session ended (``x-dynamo-session-final``): forget it."""
        entry = self._table.get(session_key)
        if entry is not None and entry.program is not None:
            entry.program = None
            self._count -= 1
        if session_key is not None:
            self._arrivals.pop(session_key, None)

    def is_paused(self, session_key: str | None) -> bool:
        """Whether this session's next turn must wait. A session admission has never seen waits
        (and joins the arrival queue) while anything is paused or waiting, or no worker has
        room for it under ``admit_threshold``."""
        if session_key is None:
            return False
        program = self._program(session_key)
        if program is not None:
            return program.paused_at is not None
        if session_key in self._arrivals:
            return True
        if not (self.config.enabled and self.config.hold_new_sessions):
            return False
        if self._arrivals or not self._has_room_for_new():
            self._arrivals[session_key] = self._clock()
            return True
        return False

    def preferred_worker(self, session_key: str | None) -> str | None:
        """Where a woken program's next turn goes first (the scheduler's ``prefer``; None: no
        preference), until that turn starts: a held new session's admitted worker, a resumed
        program's own worker. Admission resumed it because that worker has room, its KV is
        there (demoted to host memory and prefetched back, with KV hints), and the prefix
        index may have forgotten it after a long pause: without this the load scorers move
        the turn to a worker that prefills its whole context again."""
        program = self._program(session_key)
        if program is None:
            return None
        return program.target or (program.worker if program.resumed else None)

    def priority(self, session_key: str | None) -> float:
        """Seconds to move this session's next request up (+) or down (-) a wait queue."""
        program = self._program(session_key)
        if program is None:
            return 0.0
        if program.resumed:
            return self.config.resume_priority
        return self.config.demote_priority if program.worker in self._demoted else 0.0

    def utilization(self, worker_address: str) -> float:
        """U of the worker (0 while its KV capacity is unknown)."""
        capacity = self._capacity.get(worker_address)
        if not capacity:
            return 0.0
        active = (p for p in self._programs() if p.worker == worker_address)
        return sum(self._weight(p) for p in active if p.paused_at is None) / capacity

    def _has_room_for_new(self) -> bool:
        """Nothing is paused and some worker of known capacity (or none known yet) fits a new
        session under ``admit_threshold``: sessions grow, so the line leaves them room to."""
        used: dict[str, float] = dict.fromkeys(self._capacity, 0.0)
        for program in self._programs():
            if program.paused_at is not None:
                return False
            if program.worker in used:
                used[program.worker] += self._weight(program)
        need = self.config.new_session_tokens + self.config.buffer_tokens
        line = self.config.admit_threshold
        return not used or any(line * self._capacity[w] - u >= need for w, u in used.items())

    def paused_count(self) -> int:
        """Sessions waiting: paused programs and held new sessions."""
        return sum(p.paused_at is not None for p in self._programs()) + len(self._arrivals)

    def __len__(self) -> int:
        return self._count

    def __contains__(self, session_key: object) -> bool:
        return isinstance(session_key, str) and self._program(session_key) is not None

    def tick(self, workers: Sequence[Worker]) -> AdmissionTick:
        """One control step over ``workers`` (every ``tick_seconds``, for one pool or all); a
        no-op when disabled. Workers that have not reported their KV capacity are skipped."""
        if not self.config.enabled:
            return AdmissionTick()
        now = self._clock()
        self._table.expire()
        lapsed = self._lapsed(now)
        forgotten, self._forgotten = [*self._forgotten, *lapsed], []
        by_worker: dict[str, list[Program]] = defaultdict(list)
        for program in self._programs():
            by_worker[program.worker].append(program)
        paused: list[Program] = []
        resumed: list[Program] = []
        waiting: list[Program] = []
        room: dict[str, float] = {}
        """Tokens each worker with room can take before the resume line."""
        limit = self.config.pause_threshold - self.config.hysteresis
        below = limit - self.config.admit_threshold
        for worker in workers:
            capacity = self._capacity_of(worker)
            if not capacity:
                continue
            self._capacity[worker.address] = capacity
            self._demoted.discard(worker.address)
            programs = by_worker.get(worker.address, [])
            resumed += self._force_resume(programs, now)
            used = sum(self._weight(p) for p in programs if p.paused_at is None)
            waiting += (p for p in programs if p.paused_at is not None)
            if used >= self.config.pause_threshold * capacity:
                paused += self._pause(programs, used, capacity, now)
                continue
            for program in programs:
                program.pause_at_boundary = False
            if used >= self.config.demote_threshold * capacity:
                self._demoted.add(worker.address)
            room[worker.address] = limit * capacity - used
        back = self._resume(waiting, room)
        resumed += back
        if len(back) == len(waiting):
            line = {w: r - below * self._capacity[w] for w, r in room.items()}
            resumed += self._admit_arrivals(line, now)
        boundary, self._boundary = self._boundary, []
        still = [k for k in boundary if k in self and self.is_paused(k)]
        return AdmissionTick((*still, *(p.key for p in paused)), tuple(p.key for p in resumed),
                             tuple(forgotten))

    def _pause(
        self, programs: list[Program], used: float, capacity: int, now: float
    ) -> list[Program]:
        """Smallest ACTING first until U <= resume_target (never one just resumed, which would
        starve it); if REASONING programs alone keep U above that, the smallest of them is
        paused at its tool boundary."""
        target = self.config.resume_target * capacity
        acting = (p for p in programs if not p.reasoning and p.paused_at is None and not p.resumed)
        paused: list[Program] = []
        for program in sorted(acting, key=_size):
            if used <= target:
                return paused
            used -= self._weight(program)
            program.paused_at = now
            paused.append(program)
        reasoning = [p for p in programs if p.reasoning]
        if used > target and reasoning:
            min(reasoning, key=_size).pause_at_boundary = True
        return paused

    def _resume(self, waiting: list[Program], room: dict[str, float]) -> list[Program]:
        """Programs paused before this tick, smallest first (bin packing), while each fits on
        its own worker under the resume line (moving one elsewhere measured no better: its next
        turn re-prefills there whatever its own worker still holds)."""
        resumed: list[Program] = []
        for program in sorted(waiting, key=_size):
            weight = self._weight(program)
            if room.get(program.worker, -1.0) >= weight:
                room[program.worker] -= weight
                resumed.append(self._wake(program))
        return resumed

    def _admit_arrivals(self, room: dict[str, float], now: float) -> list[Program]:
        """Held new sessions in arrival order, each on the worker with the most ``room`` (under
        the admit line) while its estimated size fits there (after ``forced_resume_seconds``,
        whatever the room)."""
        admitted: list[Program] = []
        estimate = self.config.new_session_tokens + self.config.buffer_tokens
        for key, held_at in list(self._arrivals.items()):
            best = max(room, key=room.__getitem__, default=None)
            overdue = now - held_at >= self.config.forced_resume_seconds
            if best is None or (room[best] < estimate and not overdue):
                break
            room[best] -= estimate
            del self._arrivals[key]
            program = Program(key, best, estimate, False, now, resumed=True, target=best,
                              started=False)
            entry = self._table.touch(key)
            self._count += entry.program is None
            entry.program = program
            admitted.append(program)
        return admitted

    def _force_resume(self, programs: list[Program], now: float) -> list[Program]:
        """Programs paused for ``forced_resume_seconds`` resume whatever U is: none starves."""
        cap = self.config.forced_resume_seconds
        return [self._wake(p) for p in programs
                if p.paused_at is not None and now - p.paused_at >= cap]

    def _lapsed(self, now: float) -> list[str]:
        """Admissions whose first turn never came within ``hold_timeout_seconds`` (the client
        gave up) are dropped; their keys. (Idle sessions leave with the table's TTL.)"""
        lapse = self.config.hold_timeout_seconds
        gone = []
        for key, entry in self._table.items():
            program = entry.program
            if program is not None and not program.started and now - program.last_seen > lapse:
                entry.program = None
                self._count -= 1
                gone.append(key)
        return gone

    @staticmethod
    def _wake(program: Program) -> Program:
        program.paused_at, program.resumed = None, True
        return program

    def _capacity_of(self, worker: Worker) -> int | None:
        """The KV U is measured against: the device pool, plus ``host_weight`` of the host
        tier (a session whose KV waits there between turns comes back at the cost of a copy,
        not a prefill, so the device alone overstates the pressure)."""
        device = worker.capacity_tokens
        if not device or not worker.cpu_blocks:
            return device
        return device + int(self.config.host_weight * worker.cpu_blocks * worker.block_size)

    def _weight(self, program: Program) -> float:
        return program.tokens * (1.0 if program.reasoning else self.config.acting_weight)


def _size(program: Program) -> int:
    return program.tokens
