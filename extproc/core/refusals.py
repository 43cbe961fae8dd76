"""Decisions that end in a refusal still get a replay record: the error carries its id.

A request a hard lock binds to a model that model health has taken out was decided (the lock
held, the model chosen) and then refused, 503 ``model_unavailable``: its record says which lock
held it where, and its outcome says it was refused, so ``x-replay-id`` on the error explains it
like any other answer. No I/O here; the adapter calls it where it answers.
"""

from __future__ import annotations

from ..errors import LockedModelDown
from ..scheduling.placement import Placement
from ..state.store import Facts
from .identity import chained
from .router import Request, Router, decision_record


def record_refusal(router: Router, request: Request, facts: Facts,
                   error: LockedModelDown) -> str:
    """Record the lock's decision with a refused outcome; sets and returns ``error.replay_id``."""
    identity = chained(request.identity, facts.session_key)
    state = facts.session if identity.key == facts.session_key else None
    now = router.clock()
    replay_id = router.replay.new_id()
    router.replay.put(decision_record(
        replay_id, now, request.summary, identity, error.decision, Placement(()), state,
        None, request.headers.get("traceparent")))
    router.replay.complete(replay_id, {"status": error.status, "refused": error.code,
                                       "retry_after": error.retry_after})
    error.replay_id = replay_id
    return replay_id
