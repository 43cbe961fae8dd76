"""Kubernetes discovery against recorded API answers, through the official client.

No API server runs here: ``k8s_api.FakeApiServer`` replays recorded lists and watch streams
(ADDED / MODIFIED / DELETED / BOOKMARK / ERROR 410) on the paths the client calls.
"""

from __future__ import annotations

import threading
import time

import pytest

from extproc.config import WorkerSpec
from extproc.scheduling.discovery import KubernetesDiscovery, pod_endpoints, pool_spec
from extproc.scheduling.workers import WorkerRegistry

from .k8s_api import FakeApiServer, failure, listed, watched

POOLS = "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools"
PODS = "/api/v1/namespaces/llm/pods"
POOL = "saar-extproc-qwen3-8b"


class Published:
    def __init__(self) -> None:
        self.sets: list[tuple[str, ...]] = []
        self._changed = threading.Condition()

    def __call__(self, endpoints: tuple[str, ...]) -> None:
        with self._changed:
            self.sets.append(endpoints)
            self._changed.notify_all()

    def wait_for(self, endpoints: tuple[str, ...], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self.sets or self.sets[-1] != endpoints:
                left = deadline - time.monotonic()
                assert left > 0, f"never published {endpoints}; got {self.sets}"
                self._changed.wait(left)


def discovery(api: FakeApiServer, published: Published) -> KubernetesDiscovery:
    return KubernetesDiscovery("llm", POOL, published, api_client=api.client(),
                               watch_seconds=5, backoff=(0.05, 0.2))


def test_pods_follow_the_watch_through_a_bookmark_and_a_410():
    with FakeApiServer() as api:
        api.script(POOLS, listed("pool-list.json"))
        api.script(PODS, listed("pods-list-1.json"), listed("pods-list-2.json"))
        api.script(PODS, watched("pods-watch-1.jsonl"), watched("pods-watch-gone.jsonl"),
                   watch=True)
        published = Published()
        found = discovery(api, published)
        found.start()
        try:
            published.wait_for(("10.2.0.12:8000", "10.2.0.13:8000"))  # after the relist
            assert found.synced
        finally:
            found.stop()
    assert published.sets == [
        ("10.2.0.11:8000",),                      # the list: b is not ready yet
        ("10.2.0.11:8000", "10.2.0.12:8000"),     # MODIFIED: b ready; ADDED c has no IP
        ("10.2.0.12:8000",),                      # a is being deleted (then DELETED)
        ("10.2.0.12:8000", "10.2.0.13:8000"),     # 410 Gone -> the relist has c ready
    ]
    assert found.relists == 1
    pods = [q for path, q in api.requests if path == PODS]
    assert pods[0] == {"labelSelector": "app=qwen3-8b"}
    first_watch = pods[1]
    assert first_watch["watch"] == "true" and first_watch["resourceVersion"] == "1001"
    assert first_watch["allowWatchBookmarks"] == "true"
    assert first_watch["labelSelector"] == "app=qwen3-8b"
    # The stream ended (the server's timeout): the watch goes on from the last version seen,
    # the DELETED event's (after the bookmark's 1010), and the 410 there makes it list again.
    assert pods[2]["resourceVersion"] == "1012"
    assert "watch" not in pods[3]
    assert pods[4]["resourceVersion"] == "1020"
    pools = [q for path, q in api.requests if path == POOLS]
    assert pools[0] == {"fieldSelector": f"metadata.name={POOL}"}


def test_the_role_label_gives_each_pods_workers_their_phase():
    with FakeApiServer() as api:
        api.script(POOLS, listed("pool-list.json"))
        api.script(PODS, listed("pods-list-pd.json"))
        api.script(PODS, watched("pods-watch-pd.jsonl"), watch=True)
        published = Published()
        seen: list[dict[str, str]] = []

        def publish(endpoints: tuple[str, ...]) -> None:
            seen.append({spec.address: spec.role for spec in found.specs})
            published(endpoints)

        found = KubernetesDiscovery("llm", POOL, publish, api_client=api.client(),
                                    watch_seconds=5, backoff=(0.05, 0.2))
        found.start()
        try:
            published.wait_for(("10.2.0.12:8000",))  # a deleted
        finally:
            found.stop()
    assert seen[:3] == [
        {"10.2.0.11:8000": "prefill"},
        {"10.2.0.11:8000": "prefill", "10.2.0.12:8000": "decode"},
        {"10.2.0.12:8000": "decode"},
    ]


def test_a_changed_selector_and_ports_relist_the_pods():
    with FakeApiServer() as api:
        api.script(POOLS, listed("pool-list.json"))
        api.script(POOLS, watched("pool-watch.jsonl"), watch=True)
        api.script(PODS, listed("pods-list-2.json"), listed("pods-list-canary.json"))
        published = Published()
        found = discovery(api, published)
        found.start()
        try:
            published.wait_for(("[fd00::7]:8000", "[fd00::7]:8001"))
        finally:
            found.stop()
    selectors = [q.get("labelSelector") for path, q in api.requests
                 if path == PODS and "watch" not in q]
    assert selectors == ["app=qwen3-8b", "app=qwen3-8b,track=canary"]


def test_failures_back_off_and_sync_comes_after_the_first_list():
    with FakeApiServer() as api:
        api.script(POOLS, failure(500), listed("pool-list.json"))
        api.script(PODS, failure(500), failure(403), listed("pods-list-1.json"))
        published = Published()
        found = discovery(api, published)
        assert not found.synced
        found.start()
        try:
            published.wait_for(("10.2.0.11:8000",))
            assert found.synced
        finally:
            found.stop()


def test_the_registry_takes_the_pods_as_the_pools_workers(config, clock):
    registry = WorkerRegistry(config.models, clock=clock)
    before = {w.address for w in registry.pool("qwen3-8b")}
    one = (WorkerSpec(address="10.2.0.12:8000"),)
    assert registry.set_source("kubernetes", {"qwen3-8b": one}) == ()
    assert {w.address for w in registry.pool("qwen3-8b")} == before | {"10.2.0.12:8000"}
    worker = next(w for w in registry.pool("qwen3-8b") if w.address == "10.2.0.12:8000")
    worker.in_flight = 3
    registry.set_source("kubernetes", {"qwen3-8b": (
        WorkerSpec(address="10.2.0.12:8000"), WorkerSpec(address="10.2.0.13:8000"))})
    kept = next(w for w in registry.pool("qwen3-8b") if w.address == "10.2.0.12:8000")
    assert kept.in_flight == 3  # a worker that stays keeps its counts
    assert registry.set_source("kubernetes", {}) == ("10.2.0.12:8000", "10.2.0.13:8000")


@pytest.mark.parametrize(("spec", "expected"), [
    ({"selector": {"matchLabels": {"app": "m"}}, "targetPorts": [{"number": 8000}]},
     ((("app", "m"),), (8000,))),
    ({"selector": {"matchLabels": {}}, "targetPorts": [{"number": 8000}]}, None),
    ({"selector": {"matchLabels": {"app": "m"}}, "targetPorts": [{"number": "x"}]}, None),
    ({}, None),
])
def test_pool_spec(spec, expected):
    found = pool_spec({"spec": spec})
    assert (None if found is None else (found.selector, found.ports)) == expected


def test_a_pod_without_metadata_or_status_is_no_endpoint():
    from kubernetes import client

    assert pod_endpoints(client.V1Pod(), (8000,)) == ()
