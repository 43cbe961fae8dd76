"""The store contract, run against every store: in-process, Redis and Valkey (real servers), one
server and a three-primary cluster of each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from extproc.state.memory import MemoryStore
from extproc.state.records import Claim, Commit, Finish, Forget, Owner, Turn, owner_key
from extproc.state.store import Query, Store
from extproc.types import Phase, Usage
from tests.conftest import FakeClock
from tests.state.conftest import CLUSTERS, SERVERS, clustered, holder, keys, oracle, redis_store


def turn(n: int, session: str = "t/s", model: str = "m1", switched: bool = False) -> Turn:
    return Turn(f"rp-{n}", session, "t", model, "d", Phase.NORMAL, switched, 10 * n, float(n),
                "w1")


@pytest.fixture(params=["memory", *SERVERS])
async def store(request, clock, servers, prefix) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore(clock=clock, max_sessions=100, session_ttl=60, max_owned_ids=100,
                          owner_ttl=60)
        return
    shared = redis_store(servers(request.param)[1], prefix)
    yield shared
    await shared.close()


async def test_a_commit_is_loaded_back(store, clock):
    await store.apply([Commit(turn(1))], clock())
    facts = await store.load(Query("t/s"))
    assert facts.session_key == "t/s"
    assert (facts.session.model, facts.session.turns, facts.session.worker) == ("m1", 1, "w1")
    assert (await store.load(Query("t/other"))).session is None


async def test_owners_are_loaded_with_the_session_in_one_call(store, clock):
    owner = Owner("m2", "10.0.0.2:80", "t/s")
    await store.apply([Commit(turn(1)), Claim((owner_key("t", "call_1"),), owner)], clock())
    facts = await store.load(Query("t/s", (owner_key("t", "call_1"), owner_key("t", "nope"))))
    assert facts.owners == {owner_key("t", "call_1"): owner}
    assert facts.session.turns == 1


async def test_ownership_is_per_tenant(store, clock):
    await store.apply([Claim((owner_key("a", "call_1"),), Owner("m2"))], clock())
    facts = await store.load(Query(None, (owner_key("b", "call_1"),)))
    assert facts.owners == {}


async def test_a_chain_resolves_to_the_session_that_got_the_response(store, clock):
    await store.apply([Commit(turn(1, session="t/chain")),
                       Claim((owner_key("t", "resp_1"),), Owner("m1", None, "t/chain"))],
                      clock())
    facts = await store.load(Query(None, (owner_key("t", "resp_1"),), owner_key("t", "resp_1")))
    assert facts.session_key == "t/chain"
    assert facts.session.turns == 1
    unknown = await store.load(Query(None, (owner_key("t", "x"),), owner_key("t", "x")))
    assert (unknown.session_key, unknown.session) == (None, None)


async def test_a_sub_agent_found_by_its_task_keeps_its_parent_in_the_store(store, clock):
    """The parent's answer claims its spawn call's task mark; the sub-agent's first request
    finds the owner (the parent) by it; the sub-agent's record keeps the parent, and a later
    request that follows its chain reads it back."""
    task, call = owner_key("t", "task:1f"), owner_key("t", "call_s")
    await store.apply([Commit(turn(1, session="t/run")),
                       Claim((task,), Owner("m1", "w1", "t/run"))], clock())
    spawned = await store.load(Query(None, (task,)))
    assert spawned.owners[task].session == "t/run"
    first = replace(turn(2, session="t/sub"), parent="run")
    await store.apply([Commit(first), Claim((call,), Owner("m1", "w1", "t/sub"))], clock())
    later = await store.load(Query(None, (call,), call))
    assert (later.session_key, later.session.parent) == ("t/sub", "run")


async def test_switches_are_reported_once(store, clock):
    await store.apply([Commit(turn(1))], clock())
    applied = await store.apply([Commit(turn(2, model="m2", switched=True))], clock())
    assert applied.switches == (("m1", "m2"),)
    again = await store.apply([Commit(turn(2, model="m2", switched=True))], clock())
    assert again.switches == ()
    assert (await store.load(Query("t/s"))).session.switches == 1


async def test_finish_then_forget(store, clock):
    await store.apply([Finish(turn(1), tool_calls=True, usage=Usage(10, 2, 5))], clock())
    record = (await store.load(Query("t/s"))).session
    assert (record.turns, record.phase, record.reported_cached_tokens) == (1, Phase.TOOL_LOOP, 5)
    await store.apply([Forget("t/s")], clock())
    assert (await store.load(Query("t/s"))).session is None


async def test_loaded_records_are_copies(store, clock):
    await store.apply([Commit(turn(1))], clock())
    facts = await store.load(Query("t/s"))
    facts.session.turns = 99
    assert (await store.load(Query("t/s"))).session.turns == 1


def test_memory_store_expires_sessions_and_owners():
    clock = FakeClock()
    store = MemoryStore(clock=clock, max_sessions=10, session_ttl=30, max_owned_ids=10,
                        owner_ttl=100)
    store.apply_now([Commit(turn(1)), Claim((owner_key("t", "c"),), Owner("m"))], clock())
    clock.advance(31)
    facts = store.load_now(Query("t/s", (owner_key("t", "c"),)))
    assert facts.session is None and facts.owners  # the session lapsed, the id is still owned
    clock.advance(70)
    assert not store.load_now(Query(None, (owner_key("t", "c"),))).owners


async def test_redis_keys_are_namespaced_versioned_and_expire(server, prefix, clock):
    store = redis_store(server[1], prefix, session_ttl=30, owner_ttl=90)
    await store.apply([Commit(turn(1)), Claim((owner_key("t", "c"),), Owner("m"))], clock())
    client = oracle(server[1])
    owner, session = ((f"{prefix}:v1:o:{{t/c}}", f"{prefix}:v1:s:{{t/s}}") if clustered(server)
                      else (f"{prefix}:v1:o:t/c", f"{prefix}:v1:s:t/s"))
    assert await keys(client, f"{prefix}:*") == [owner, session]
    assert 0 < await client.pttl(session) <= 30_000
    assert 30_000 < await client.pttl(owner) <= 90_000
    await client.aclose()
    await store.close()


@pytest.mark.parametrize("kind", CLUSTERS)
async def test_a_cluster_spreads_sessions_over_its_primaries_and_no_client_picks_a_slot(
        kind, servers, prefix, clock):
    """Hash tags put each session's record in the slot of its own name, so sessions spread
    over every primary; a session id holding braces cannot choose the slot (a naive tag would
    put all of these in the slot of ``same``)."""
    url = servers(kind)[1]
    store = redis_store(url, prefix)
    named = [f"t/s{n}" for n in range(30)] + [f"t/{{same}}{n}" for n in range(30)]
    await store.apply([Commit(turn(1, session=name)) for name in named], clock())
    for name in named:
        assert (await store.load(Query(name))).session.turns == 1
    client = oracle(url)
    stored = await keys(client, f"{prefix}:*")
    assert len(stored) == len(named)
    slots = {key: await client.cluster_keyslot(key) for key in stored}  # the server's CRC16
    braced = {slot for key, slot in slots.items() if "same" in key}
    assert len(braced) > 10
    holders = {await holder(client, slot) for slot in slots.values()}
    assert len(holders) == 3  # every primary holds sessions
    await client.aclose()
    await store.close()


async def test_two_replicas_racing_on_a_session_never_undo_a_lock(server, prefix, clock):
    """Replica A commits a turn that called tools (a tool loop); replica B, from an older
    read, commits the next turn: compare-and-set makes B re-apply on A's record, so the
    switch is counted once and nothing A wrote is lost."""
    a, b = redis_store(server[1], prefix), redis_store(server[1], prefix)
    await a.apply([Commit(turn(1))], clock())
    await b.load(Query("t/s"))  # B's base: version 1
    await a.apply([Commit(turn(2, model="m2", switched=True)),
                   Finish(turn(2, model="m2", switched=True), tool_calls=True)], clock())
    applied = await b.apply([Commit(turn(3, model="m2", switched=True))], clock())
    assert applied.switches == ()  # A already moved the session: not a second switch
    record = (await a.load(Query("t/s"))).session
    assert (record.turns, record.switches, record.model) == (3, 1, "m2")
    assert record.recent[-3:] == ("rp-1", "rp-2", "rp-3")
    await a.close()
    await b.close()


async def test_many_replicas_racing_lose_no_turn(server, prefix, clock):
    import asyncio

    replicas = [redis_store(server[1], prefix) for _ in range(4)]
    for replica in replicas:
        await replica.load(Query("t/s"))
    await asyncio.gather(*(
        replica.apply([Commit(turn(10 * i + n))], clock())
        for i, replica in enumerate(replicas) for n in range(5)
    ))
    record = (await replicas[0].load(Query("t/s"))).session
    assert record.turns == 20
    for replica in replicas:
        await replica.close()
