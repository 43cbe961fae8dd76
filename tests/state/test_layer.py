"""The state layer in front of a real Redis / Valkey, one server or a cluster: timeouts, an
outage, the write-back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from extproc.dev.harness import StoreProcess, store_server
from extproc.observability.metrics import Metrics
from extproc.state.layer import StateLayer
from extproc.state.memory import MemoryStore
from extproc.state.records import Claim, Commit, Forget, Owner, Turn, owner_key
from extproc.state.store import Query
from extproc.types import Phase
from tests.state.conftest import SERVERS, redis_store

TIMEOUT = 0.05


def turn(n: int, session: str = "t/s", model: str = "m1") -> Turn:
    return Turn(f"rp-{n}", session, "t", model, "d", Phase.NORMAL, False, 10, float(n), "w1")


def claim(call: str, model: str = "m1") -> Claim:
    return Claim((owner_key("t", call),), Owner(model, "w1", "t/s"))


def layer(url: str, prefix: str, metrics: Metrics | None = None,
          timeout: float = TIMEOUT) -> StateLayer:
    clock = time.time
    local = MemoryStore(clock=clock, max_sessions=1000, session_ttl=600, max_owned_ids=1000,
                        owner_ttl=600)
    return StateLayer(local, redis_store(url, prefix), clock=clock,
                      metrics=metrics or Metrics(), timeout=timeout)


@pytest.fixture(params=SERVERS)
async def restartable(request, tmp_path) -> AsyncIterator[tuple[StoreProcess, str]]:
    """A server (or cluster) of this test's own, to stop and start again on the same ports."""
    with store_server(request.param, tmp_path) as running:
        yield running


async def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_a_layer_without_a_shared_store_is_the_local_store():
    local = MemoryStore(clock=time.time, max_sessions=10, session_ttl=60, max_owned_ids=10,
                        owner_ttl=60)
    state = StateLayer(local, None, clock=time.time, metrics=Metrics())
    await state.apply([Commit(turn(1)), claim("c")])
    facts = await state.load(Query("t/s", (owner_key("t", "c"),)))
    assert facts.session.turns == 1 and facts.owners
    assert state.up


async def test_a_new_replica_serves_the_locks_from_its_first_request(server, prefix):
    """Warm start: whatever one replica wrote, a replica started later loads."""
    url = server[1]
    first = layer(url, prefix)
    first.start()
    await first.apply([Commit(turn(1)), claim("call_1", "m2")])
    await first.stop()
    fresh = layer(url, prefix)
    facts = await fresh.load(Query("t/s", (owner_key("t", "call_1"),)))
    assert facts.session.turns == 1
    assert facts.owners[owner_key("t", "call_1")].model == "m2"
    await fresh.stop()


async def test_sent_writes_reach_the_store_in_order(server, prefix):
    url = server[1]
    state, reader = layer(url, prefix), layer(url, prefix)
    state.start()
    for n in range(1, 6):
        state.send([Commit(turn(n))])
    await state.stop()  # drains what was sent
    recent = (await reader.load(Query("t/s"))).session.recent
    assert recent[-5:] == tuple(f"rp-{n}" for n in range(1, 6))
    await reader.stop()


async def test_sends_queued_meanwhile_share_one_call_and_a_forget_ends_it(server, prefix):
    """The writer joins the sends that queued while it was busy (a busy session's turns, one
    compare-and-set); a store's call writes records before it forgets, so a send that follows
    a Forget goes in the next call: the session is forgotten, then written again."""
    url = server[1]
    metrics = Metrics()
    state, reader = layer(url, prefix, metrics), layer(url, prefix)
    state.start()
    for n in range(1, 6):
        state.send([Commit(turn(n))])
    await state.stop()
    sends = metrics.registry.get_sample_value("saar_store_seconds_count", {"op": "send"})
    assert sends == 1, "five sends queued at once went in one call"
    assert (await reader.load(Query("t/s"))).session.recent[-5:] == tuple(
        f"rp-{n}" for n in range(1, 6))

    state = layer(url, prefix, metrics)
    state.start()
    state.send([Commit(turn(6)), Forget("t/s")])
    state.send([Commit(turn(7))])
    await state.stop()
    again = (await reader.load(Query("t/s"))).session
    assert again is not None and again.recent == ("rp-7",), "forgotten, then turn 7 alone"
    assert metrics.registry.get_sample_value("saar_store_seconds_count", {"op": "send"}) == 3
    await reader.stop()


async def test_an_outage_serves_locally_then_writes_back_what_it_learnt(restartable):
    """The store goes away mid-run: requests are served from local state at once, every lock
    known here holds, the outage is counted, and once the store is back (empty: no
    persistence) the backlog is written so another replica sees everything."""
    service, url = restartable
    metrics = Metrics()
    state = layer(url, "o", metrics)
    state.start()
    await state.apply([Commit(turn(1)), claim("call_1")])
    service.stop(kill=True)

    started = time.perf_counter()
    facts = await state.load(Query("t/s", (owner_key("t", "call_1"),)))
    assert time.perf_counter() - started < 1.0  # bounded by the timeout, not a TCP timeout
    assert not state.up
    assert facts.session.turns == 1 and facts.owners  # the lock known locally holds
    assert metrics.store_up._value.get() == 0
    await state.apply([Commit(turn(2)), claim("call_2")])  # learnt during the outage
    state.send([claim("call_3")])
    await wait_for(lambda: metrics.store_backlog._value.get() >= 2)
    errors = sum(s.value for m in metrics.store_errors.collect() for s in m.samples
                 if s.name.endswith("_total"))
    assert errors >= 1

    service.start()
    await wait_for(lambda: state.up)
    assert metrics.store_backlog._value.get() == 0
    other = layer(url, "o")
    facts = await other.load(Query("t/s", tuple(owner_key("t", f"call_{n}") for n in (1, 2, 3))))
    # The store came back empty: the session was seeded from the local copy, nothing lost.
    assert (facts.session.turns, facts.session.recent) == (2, ("rp-1", "rp-2"))
    assert set(facts.owners) == {owner_key("t", f"call_{n}") for n in (2, 3)}
    assert (await state.load(Query("t/s", (owner_key("t", "call_1"),)))).owners  # still here
    await other.stop()
    await state.stop()


async def test_a_lock_known_locally_survives_a_store_that_lost_it(restartable):
    service, url = restartable
    state = layer(url, "l")
    state.start()
    await state.apply([Commit(turn(1)), claim("call_1", "m2")])
    service.stop()
    service.start()  # a restart without persistence: the store forgot everything
    facts = await state.load(Query("t/s", (owner_key("t", "call_1"),)))
    assert facts.owners[owner_key("t", "call_1")].model == "m2"
    assert facts.session is not None and facts.session.turns == 1
    await state.stop()


async def test_sessions_with_writes_waiting_are_served_from_the_local_copy(restartable):
    service, url = restartable
    state = layer(url, "d")
    state.start()
    await state.apply([Commit(turn(1))])
    service.stop(kill=True)
    await state.apply([Commit(turn(2))])
    service.start()  # back, and empty, before the backlog has been written
    assert (await state.load(Query("t/s"))).session.turns == 2
    await state.stop()


async def test_replicas_share_one_tenant_secret(server, prefix, tmp_path):
    from extproc.config import parse_config
    from tests.conftest import session_config_data

    config = parse_config(session_config_data())
    url = server[1]
    one, two = layer(url, prefix), layer(url, prefix)
    secret = await one.tenant_secret(config)
    assert secret is not None and len(secret) == 32
    assert await two.tenant_secret(config) == secret
    path = tmp_path / "secret"
    path.write_bytes(b"a-configured-secret-of-enough-bytes\n")
    data = session_config_data()
    data["identity"]["tenant_secret_file"] = str(path)
    assert await one.tenant_secret(parse_config(data)) == b"a-configured-secret-of-enough-bytes"
    await one.stop()
    await two.stop()


class Slow:
    """A real store whose next ``calls`` writes come late (a loaded machine, a GC pause):
    later than the layer waits for an answer's write."""

    def __init__(self, store, calls: int, late: float) -> None:
        self.store, self.calls, self.late = store, calls, late

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def apply(self, writes, now):
        if self.calls:
            self.calls -= 1
            await asyncio.sleep(self.late)
        return await self.store.apply(writes, now)


def slow_layer(url: str, prefix: str, calls: int) -> tuple[StateLayer, Slow]:
    from extproc.state.layer import OFF_PATH

    quick = 0.01
    state = layer(url, prefix, timeout=quick)
    slow = Slow(state.shared, calls, late=quick * OFF_PATH * 1.5)
    state.shared = slow
    return state, slow


async def test_one_slow_answer_does_not_stop_the_writes_other_replicas_read(server, prefix):
    """The lock loss seen under load: a replica that stopped writing after one timeout left
    its commits invisible to the other replica. One slow call keeps the store in use."""
    url = server[1]
    (mine, _), other = slow_layer(url, prefix, calls=1), layer(url, prefix)
    mine.start()
    await mine.apply([Commit(turn(1))])  # slow: served locally, sent again later
    assert mine.up
    await mine.apply([Commit(turn(2)), claim("call_2")])  # goes straight to the store
    facts = await other.load(Query("t/s", (owner_key("t", "call_2"),)))
    assert facts.session.last_replay_id == "rp-2" and facts.owners
    await wait_for(lambda: not mine._backlog)
    record = (await other.load(Query("t/s"))).session
    # Turn 1 landed after turn 2: counted, but the newer turn's state stands.
    assert (record.turns, record.last_replay_id, set(record.recent)) == (2, "rp-2",
                                                                         {"rp-1", "rp-2"})
    await mine.stop()
    await other.stop()


async def test_a_stopping_replica_writes_its_backlog_first(server, prefix):
    """A write that came back too late waits in the backlog; a replica stopped before its
    recovery sent it (here it never started) sends it on the way out: the lock stays."""
    (state, _), other = slow_layer(server[1], prefix, calls=1), layer(server[1], prefix)
    await state.apply([Commit(turn(1)), claim("call_1")])
    assert state._backlog and state.up
    await state.stop()
    facts = await other.load(Query("t/s", (owner_key("t", "call_1"),)))
    assert facts.owners[owner_key("t", "call_1")].model == "m1"
    assert facts.session.last_replay_id == "rp-1"
    await other.stop()


async def test_slow_answers_in_a_row_mark_the_store_down(server, prefix):
    from extproc.state.layer import TRIP_TIMEOUTS

    state, slow = slow_layer(server[1], prefix, calls=10**6)
    state.start()
    for n in range(TRIP_TIMEOUTS):
        await state.apply([Commit(turn(n + 1))])
    assert not state.up
    slow.calls = 0
    await wait_for(lambda: state.up)  # the store answers again: back, backlog written
    assert (await layer(server[1], prefix).load(Query("t/s"))).session.turns == 3
    await state.stop()


async def test_a_store_back_empty_is_seeded_with_everything_a_replica_knows(restartable):
    """Redis restarted without persistence lost every key, the tenant secret too: the replica
    puts back the secret and every record and owner it knows, so a replica started later
    agrees on tenants and finds locks learnt long before the outage."""
    from extproc.config import parse_config
    from tests.conftest import session_config_data

    service, url = restartable
    config = parse_config(session_config_data())
    state = layer(url, "w")
    secret = await state.tenant_secret(config)
    state.start()
    await state.apply([Commit(turn(1, session="t/old")), claim("call_old", "m2")])
    service.stop(kill=True)
    await state.apply([Commit(turn(2))])  # during the outage
    service.start()
    await wait_for(lambda: state.up)
    later = layer(url, "w")
    assert await later.tenant_secret(config) == secret
    facts = await later.load(Query("t/old", (owner_key("t", "call_old"),)))
    assert facts.session is not None and facts.owners[owner_key("t", "call_old")].model == "m2"
    assert (await later.load(Query("t/s"))).session.turns == 1
    await later.stop()
    await state.stop()
