"""``saar check``'s store probe against real servers: one server and a cluster answer, a port
nobody listens on is a problem that names the key."""

from __future__ import annotations

from dataclasses import replace

import pytest

from extproc.config import State
from extproc.dev.harness import free_port, store_server
from extproc.service.preflight import store_problems


@pytest.mark.parametrize("kind", ["redis", "redis-cluster"])
def test_a_store_that_answers_is_no_problem(config, kind, tmp_path):
    with store_server(kind, tmp_path) as (_, url):
        assert store_problems(replace(config, state=State(store="redis", redis_url=url))) == []


def test_a_store_nobody_listens_on_is_a_problem_naming_the_key(config):
    url = f"redis://127.0.0.1:{free_port()}"
    (problem,) = store_problems(replace(config, state=State(store="redis", redis_url=url)),
                                timeout=0.5)
    assert problem.startswith(f"state.redis_url: {url} does not answer (")


def test_an_in_process_store_is_never_probed(config):
    assert store_problems(config) == []
