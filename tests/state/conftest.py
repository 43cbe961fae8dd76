"""Real store servers for the state tests: redis-server and valkey-server on free ports, one
server or a three-primary cluster of each, started by the fixtures (``make install`` installs
both; a missing one fails, it is never skipped)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from extproc.dev.harness import StoreCluster, StoreProcess, store_server
from extproc.state.cluster import ClusterUrl, is_cluster_url
from extproc.state.redis import RedisStore

SINGLE = ("redis", "valkey")
CLUSTERS = ("redis-cluster", "valkey-cluster")
SERVERS = (*SINGLE, *CLUSTERS)
_prefixes = itertools.count()

Servers = Callable[[str], tuple[StoreProcess, str]]


@pytest.fixture(scope="session")
def servers(tmp_path_factory) -> Iterator[Servers]:
    """kind → (the server process, its URL), each started once for the session on demand."""
    with contextlib.ExitStack() as stack:
        running: dict[str, tuple[StoreProcess, str]] = {}

        def get(kind: str) -> tuple[StoreProcess, str]:
            if kind not in running:
                running[kind] = stack.enter_context(
                    store_server(kind, tmp_path_factory.mktemp(kind)))
            return running[kind]

        yield get


@pytest.fixture(params=SERVERS)
def server(request, servers: Servers) -> tuple[StoreProcess, str]:
    return servers(request.param)


def oracle(url: str) -> Any:
    """redis-py's client of the store at ``url`` (its cluster client for
    ``redis+cluster://``): what a test reads the store with, never the code under test."""
    from redis.asyncio import Redis
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    if is_cluster_url(url):
        parsed = ClusterUrl.parse(url)
        return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in parsed.seeds],
                            username=parsed.username, password=parsed.password, ssl=parsed.tls)
    return Redis.from_url(url, decode_responses=False)


def redis_store(url: str, prefix: str, **options: float) -> RedisStore:
    return RedisStore(url, prefix=prefix, session_ttl=options.get("session_ttl", 60.0),
                      owner_ttl=options.get("owner_ttl", 60.0))


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own: tests share a server, never a key."""
    return f"t{next(_prefixes)}"


@pytest.fixture
async def shared(server, prefix) -> AsyncIterator[RedisStore]:
    store = redis_store(server[1], prefix)
    yield store
    await store.close()


def clustered(server: tuple[StoreProcess, str]) -> bool:
    return isinstance(server[0], StoreCluster)


async def keys(client: Any, pattern: str) -> list[str]:
    """Every key matching ``pattern``, on every primary of a cluster."""
    if hasattr(client, "get_primaries"):
        await client.initialize()  # the cluster's nodes are known only once it has read them
        found = await client.keys(pattern, target_nodes=client.get_primaries())
    else:
        found = await client.keys(pattern)
    return sorted(k.decode() for k in found)


async def holder(client: Any, slot: int) -> tuple[str, int]:
    """The primary serving ``slot``, as the cluster itself says (``CLUSTER SLOTS``)."""
    for (start, end), served in (await client.cluster_slots()).items():
        if start <= slot <= end:
            host, port = served["primary"]
            return host, int(port)
    raise AssertionError(f"slot {slot} is not served")
