"""Real store servers for the state tests: redis-server and valkey-server on free ports, started
by the fixtures (``make install`` installs both; a missing one fails, it is never skipped)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from extproc.dev.harness import Service, store_server
from extproc.state.redis import RedisStore

SERVERS = ("redis", "valkey")
_prefixes = itertools.count()

Servers = Callable[[str], tuple[Service, str]]


@pytest.fixture(scope="session")
def servers(tmp_path_factory) -> Iterator[Servers]:
    """kind → (the server process, its URL), each started once for the session on demand."""
    with contextlib.ExitStack() as stack:
        running: dict[str, tuple[Service, str]] = {}

        def get(kind: str) -> tuple[Service, str]:
            if kind not in running:
                running[kind] = stack.enter_context(
                    store_server(kind, tmp_path_factory.mktemp(kind)))
            return running[kind]

        yield get


@pytest.fixture(params=SERVERS)
def server(request, servers: Servers) -> tuple[Service, str]:
    return servers(request.param)


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
