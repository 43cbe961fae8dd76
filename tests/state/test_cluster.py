"""The store on a real Redis / Valkey Cluster as it changes under it: a slot moved from one
primary to another while sessions are written (``ASK`` mid-migration, ``MOVED`` after), and a
primary killed and replaced by its replica. The lock assertions are the single server's: what
was written is read back whole, by this replica and by one started later."""

from __future__ import annotations

import asyncio
import time

import pytest

from extproc.dev.harness import StoreCluster, store_server
from extproc.state.cluster import ClusterClient, ClusterUrl, key_slot
from extproc.state.records import Claim, Commit, Finish, Owner, Turn, owner_key
from extproc.state.redis import hash_tagged
from extproc.state.store import Query
from extproc.types import Phase
from tests.state.conftest import CLUSTERS, redis_store


def turn(n: int, session: str = "t/s", model: str = "m1") -> Turn:
    return Turn(f"rp-{n}", session, "t", model, "d", Phase.NORMAL, False, 10 * n, float(n),
                "w1")


@pytest.mark.parametrize(("url", "parsed"), [
    ("redis+cluster://10.0.0.1:6379", ClusterUrl((("10.0.0.1", 6379),))),
    ("redis+cluster://a:1,b:2/", ClusterUrl((("a", 1), ("b", 2)))),
    ("rediss+cluster://user:p%40ss@a:1/0", ClusterUrl((("a", 1),), True, "user", "p@ss")),
    ("redis+cluster://:secret@[::1]:7000", ClusterUrl((("::1", 7000),), False, None, "secret")),
])
def test_cluster_urls(url, parsed):
    assert ClusterUrl.parse(url) == parsed


@pytest.mark.parametrize("url", ["redis://a:1", "redis+cluster://a", "redis+cluster://a:1,b",
                                 "redis+cluster://a:99999"])
def test_bad_cluster_urls_are_refused(url):
    with pytest.raises(ValueError):
        ClusterUrl.parse(url)


@pytest.mark.parametrize(("name", "key"), [
    ("t/s", "p:s:{t/s}"),
    ("tenant/0b8f-uuid", "p:s:{tenant/0b8f-uuid}"),
    ("t/{a}", "p:s:{h-" + "%s}t/{a}"),
    ("t/}", "p:s:{h-" + "%s}t/}"),
])
def test_hash_tags(name, key):
    import xxhash

    assert hash_tagged("p:s:", name) == key.replace("%s", xxhash.xxh3_64_hexdigest(name.encode()))


@pytest.mark.parametrize("kind", CLUSTERS)
async def test_slots_are_the_servers(kind, servers):
    """Our CRC16 against the cluster's own ``CLUSTER KEYSLOT``: tags, empty tags, no tags."""
    client = ClusterClient(servers(kind)[1])
    for key in ("a", "t/s", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap",
                "foo{bar}{zap}", "{}x", "p:v1:s:{t/s}", "ünï{cödé}"):
        assert key_slot(key) == await client.call("x", "CLUSTER", "KEYSLOT", key), key
    await client.close()


def ids(cluster: StoreCluster) -> dict[int, str]:
    """Client port → node id of every node."""
    out = {}
    for index, port in enumerate(cluster.ports):
        with cluster.client(index) as client:
            out[port] = client.execute_command("CLUSTER", "MYID").decode()
    return out


def owner_of(cluster: StoreCluster, slot: int) -> int:
    """The client port of the primary serving ``slot``, as the cluster says."""
    with cluster.client(0) as client:
        for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
    raise AssertionError(slot)


@pytest.mark.parametrize("kind", CLUSTERS)
async def test_a_slot_moved_under_load_keeps_every_lock(kind, tmp_path):
    """Resharding, step by step as ``redis-cli --cluster reshard`` does it: while the slot is
    migrating its key answers ``ASK`` from the source (the store follows it to the target),
    once it has moved the source answers ``MOVED`` (the store updates its map)."""
    with store_server(kind, tmp_path) as (cluster, url):
        assert isinstance(cluster, StoreCluster)
        store = redis_store(url, "mv")
        call = owner_key("t", "call_1")
        await store.apply([Commit(turn(1)), Claim((call,), Owner("m2", "w2", "t/s"))], 1.0)
        key = store.record_key("t/s")
        slot = key_slot(key)
        source = owner_of(cluster, slot)
        target = next(p for p in cluster.ports[:cluster.primaries] if p != source)
        node = ids(cluster)
        src, dst = (cluster.client(cluster.ports.index(p)) for p in (source, target))
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node[source])
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node[target])
        src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", key)
        # Mid-migration: the record lives on the target, the source says ASK.
        facts = await store.load(Query("t/s", (call,)))
        assert facts.session.turns == 1 and facts.owners[call].model == "m2"
        await store.apply([Commit(turn(2)), Finish(turn(2), tool_calls=True)], 2.0)
        for port in cluster.ports[:cluster.primaries]:
            with cluster.client(cluster.ports.index(port)) as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", node[target])
        cluster.wait_ok()
        # Moved: the source now answers MOVED; the store follows and learns the new owner.
        facts = await store.load(Query("t/s", (call,)))
        assert (facts.session.turns, facts.session.phase) == (2, Phase.TOOL_LOOP)
        assert store.cluster is not None and store.cluster.node_of(key) == ("127.0.0.1", target)
        later = redis_store(url, "mv")  # a replica started after the move reads it all
        facts = await later.load(Query("t/s", (call,)))
        assert facts.session.recent == ("rp-1", "rp-2") and facts.owners[call].worker == "w2"
        src.close()
        dst.close()
        await store.close()
        await later.close()


async def wait_until(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await check():
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
        assert time.monotonic() < deadline, "not in time"
        await asyncio.sleep(0.1)


async def test_a_primary_killed_is_replaced_by_its_replica_and_the_locks_hold(tmp_path):
    """Three primaries with a replica each: the primary holding a session in a tool loop is
    killed; once its replica is promoted the store finds it (the slot map read again) and the
    session's lock and the call's owner are there, for this replica and a new one."""
    with store_server("valkey-cluster-replicated", tmp_path) as (cluster, url):
        assert isinstance(cluster, StoreCluster)
        store = redis_store(url, "fo")
        call = owner_key("t", "call_1")
        await store.apply([Finish(turn(1), tool_calls=True),
                           Claim((call,), Owner("m2", "w2", "t/s"))], 1.0)
        key = store.record_key("t/s")
        primary = owner_of(cluster, key_slot(key))
        replica = next(i for i in range(cluster.primaries, len(cluster.nodes))
                       if _follows(cluster, i, primary))

        def replicated() -> bool:
            with cluster.client(replica) as client:
                client.execute_command("READONLY")
                return bool(client.exists(key))

        await wait_until(lambda: asyncio.to_thread(replicated))
        cluster.nodes[cluster.ports.index(primary)].stop(kill=True)

        async def answers() -> bool:
            await store.ping()  # reads the map again: the promoted replica serves the slot
            return True

        await wait_until(answers)
        assert owner_of(cluster, key_slot(key)) == cluster.ports[replica]
        facts = await store.load(Query("t/s", (call,)))
        assert facts.session.phase is Phase.TOOL_LOOP
        later = redis_store(url, "fo")
        facts = await later.load(Query("t/s", (call,)))
        assert facts.session.phase is Phase.TOOL_LOOP and facts.owners[call].model == "m2"
        await store.close()
        await later.close()


def _follows(cluster: StoreCluster, index: int, primary_port: int) -> bool:
    with cluster.client(index) as client:
        return client.info("replication").get("master_port") == primary_port
