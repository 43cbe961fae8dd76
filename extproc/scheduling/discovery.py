"""Workers from Kubernetes: the ready pods an InferencePool selects, watched.

``scheduling.discovery: {mode: kubernetes, namespace: NS, inference_pool: NAME}``. Two watches,
each list then watch from the list's ``resourceVersion`` with the official client, run in a
thread of their own (the client blocks):

* the InferencePool (``inference.networking.k8s.io/v1``): ``spec.selector.matchLabels`` and
  ``spec.targetPorts[].number``. A changed selector or port list restarts the pod watch;
* the pods that selector matches: a pod is a worker once it has an IP, its ``Ready`` condition
  is ``True`` and it is not being deleted; every target port of it is one worker
  (``ip:port``).

An expired ``resourceVersion`` (410 Gone, as an ERROR event or a status) re-lists; any other
failure backs off (doubling, capped) and re-lists; a watch the server ends (its timeout) goes on
from the last ``resourceVersion`` seen, bookmarks included. The endpoint set is handed to
``publish`` whenever it changes — from the watching thread: the caller moves it onto its loop.
``synced`` turns true at the first complete list of pods (readiness waits for it).
A pod's ``role_label`` (llm-d's ``llm-d.ai/role``: ``prefill``, ``decode``, ``both``) is its
workers' phase in a disaggregated pool: ``specs`` gives the workers with their roles, and a
changed role publishes too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..config import ROLES, Role, WorkerSpec

log = logging.getLogger(__name__)

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
PLURAL = "inferencepools"
GONE = 410


@dataclass(frozen=True, slots=True)
class PoolSpec:
    selector: tuple[tuple[str, str], ...]
    ports: tuple[int, ...]

    @property
    def label_selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.selector)


def pool_spec(pool: Mapping[str, Any]) -> PoolSpec | None:
    """The part of an InferencePool that says which pods and ports; None when unusable."""
    spec = pool.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    ports = tuple(int(p["number"]) for p in spec.get("targetPorts") or ()
                  if isinstance(p, dict) and isinstance(p.get("number"), int))
    if not labels or not ports:
        return None
    return PoolSpec(tuple(sorted((str(k), str(v)) for k, v in labels.items())), ports)


def pod_endpoints(pod: Any, ports: tuple[int, ...]) -> tuple[str, ...]:
    """``ip:port`` for every target port of a ready pod; () for one that is not ready."""
    metadata, status = pod.metadata, pod.status
    if metadata is None or status is None or metadata.deletion_timestamp is not None:
        return ()
    ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or ())
    if not ready or not status.pod_ip:
        return ()
    host = f"[{status.pod_ip}]" if ":" in status.pod_ip else status.pod_ip
    return tuple(f"{host}:{port}" for port in ports)


class KubernetesDiscovery:
    def __init__(
        self,
        namespace: str,
        pool: str,
        publish: Callable[[tuple[str, ...]], None],
        *,
        api_client: Any = None,
        watch_seconds: int = 60,
        backoff: tuple[float, float] = (0.2, 5.0),
        role_label: str = "llm-d.ai/role",
    ) -> None:
        from kubernetes import client

        self.namespace = namespace
        self.pool = pool
        self._publish = publish
        self._api = api_client or _default_client()
        self._core = client.CoreV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)
        self._watch_seconds = watch_seconds
        self._backoff = backoff
        self._stopped = threading.Event()
        self._spec_changed = threading.Event()
        self._spec: PoolSpec | None = None
        self._spec_known = threading.Event()
        self._pods: dict[str, tuple[str, ...]] = {}
        self._roles: dict[str, Role] = {}
        """Pod → its phase, from ``role_label`` (a pod without it, or with another value, is
        ``both``)."""
        self._role_label = role_label
        self._published: tuple[WorkerSpec, ...] | None = None
        self._watches: list[Any] = []
        self._threads: list[threading.Thread] = []
        self.synced = False
        self.relists = 0
        """How many times the pods were listed again (410 Gone, a failure, a new selector)."""

    def start(self) -> None:
        for name, target in (("pool", self._pool_loop), ("pods", self._pod_loop)):
            thread = threading.Thread(target=target, name=f"discovery-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 1.0) -> None:
        self._stopped.set()
        self._spec_changed.set()
        self._spec_known.set()
        for watch in list(self._watches):
            watch.stop()
        for thread in self._threads:
            thread.join(timeout)

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(sorted({e for found in self._pods.values() for e in found}))

    @property
    def specs(self) -> tuple[WorkerSpec, ...]:
        """The ready pods' workers with their roles (what the registry takes)."""
        found = {e: self._roles.get(name, "both")
                 for name, endpoints in self._pods.items() for e in endpoints}
        return tuple(WorkerSpec(address=e, role=found[e]) for e in sorted(found))

    def _role(self, pod: Any) -> Role:
        value = ((pod.metadata.labels or {}) if pod.metadata is not None else {}).get(
            self._role_label)
        return value if value in ROLES else "both"

    # -- the InferencePool -----------------------------------------------------------------

    def _pool_loop(self) -> None:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        delay = self._backoff[0]
        selector = f"metadata.name={self.pool}"
        while not self._stopped.is_set():
            try:
                listed: Any = self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, field_selector=selector)
                items = listed.get("items") or []
                self._set_spec(pool_spec(items[0]) if items else None)
                version = (listed.get("metadata") or {}).get("resourceVersion")
                w = watch.Watch()
                self._watches.append(w)
                try:
                    for event in w.stream(
                        self._custom.list_namespaced_custom_object, GROUP, VERSION,
                        self.namespace, PLURAL, field_selector=selector,
                        resource_version=version, timeout_seconds=self._watch_seconds,
                    ):
                        kind, obj = event["type"], event["object"]
                        if kind in ("ADDED", "MODIFIED"):
                            self._set_spec(pool_spec(obj))
                        elif kind == "DELETED":
                            self._set_spec(None)
                        if self._stopped.is_set():
                            break
                finally:
                    self._watches.remove(w)
                delay = self._backoff[0]
            except ApiException as exc:
                if exc.status != GONE:
                    log.warning("InferencePool %s/%s: %s; retrying in %.1fs",
                                self.namespace, self.pool, exc.reason, delay)
                    delay = self._pause(delay)
            except Exception as exc:  # the API server is unreachable, a bad answer...
                log.warning("InferencePool %s/%s: %s; retrying in %.1fs",
                            self.namespace, self.pool, exc, delay)
                delay = self._pause(delay)

    def _set_spec(self, spec: PoolSpec | None) -> None:
        known = self._spec_known.is_set()
        if known and spec == self._spec:
            return
        self._spec = spec
        self._spec_known.set()
        if known:
            log.info("InferencePool %s/%s changed: %s", self.namespace, self.pool, spec)
            self._spec_changed.set()
            for w in list(self._watches):
                if getattr(w, "saar_pods", False):
                    w.stop()

    # -- its pods --------------------------------------------------------------------------

    def _pod_loop(self) -> None:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        delay = self._backoff[0]
        first = True
        while not self._stopped.is_set():
            self._spec_known.wait()
            if self._stopped.is_set():
                return
            self._spec_changed.clear()
            spec = self._spec
            if not first:
                self.relists += 1
            first = False
            try:
                if spec is None:
                    self._pods = {}
                    self._changed(synced=True)
                    self._spec_changed.wait()
                    continue
                pods: Any = self._core.list_namespaced_pod(
                    self.namespace, label_selector=spec.label_selector)
                self._pods = {p.metadata.name: pod_endpoints(p, spec.ports)
                              for p in pods.items}
                self._roles = {p.metadata.name: self._role(p) for p in pods.items}
                self._changed(synced=True)
                version = pods.metadata.resource_version
                while not self._stopped.is_set() and not self._spec_changed.is_set():
                    w = watch.Watch()
                    w.saar_pods = True  # type: ignore[attr-defined]
                    self._watches.append(w)
                    try:
                        for event in w.stream(
                            self._core.list_namespaced_pod, self.namespace,
                            label_selector=spec.label_selector, resource_version=version,
                            allow_watch_bookmarks=True, timeout_seconds=self._watch_seconds,
                        ):
                            self._on_pod(event, spec)
                            if self._stopped.is_set() or self._spec_changed.is_set():
                                break
                    finally:
                        self._watches.remove(w)
                    version = w.resource_version or version
                delay = self._backoff[0]
            except ApiException as exc:
                if exc.status == GONE:
                    log.info("pods of %s/%s: resourceVersion expired; listing again",
                             self.namespace, self.pool)
                else:
                    log.warning("pods of %s/%s: %s; retrying in %.1fs",
                                self.namespace, self.pool, exc.reason, delay)
                    delay = self._pause(delay)
            except Exception as exc:
                log.warning("pods of %s/%s: %s; retrying in %.1fs",
                            self.namespace, self.pool, exc, delay)
                delay = self._pause(delay)

    def _on_pod(self, event: Mapping[str, Any], spec: PoolSpec) -> None:
        kind, pod = event["type"], event["object"]
        if kind not in ("ADDED", "MODIFIED", "DELETED") or pod.metadata is None:
            return  # BOOKMARK: the watch keeps its resourceVersion itself
        name = pod.metadata.name
        found = () if kind == "DELETED" else pod_endpoints(pod, spec.ports)
        if found:
            self._pods[name] = found
            self._roles[name] = self._role(pod)
        else:
            self._pods.pop(name, None)
            self._roles.pop(name, None)
        self._changed()

    def _changed(self, *, synced: bool = False) -> None:
        specs = self.specs
        if specs != self._published:  # a pod's role may change with its endpoints unchanged
            self._published = specs
            log.info("InferencePool %s/%s: %d ready endpoints", self.namespace, self.pool,
                     len(specs))
            self._publish(self.endpoints)
        if synced:
            self.synced = True

    def _pause(self, delay: float) -> float:
        self._stopped.wait(delay)
        return min(self._backoff[1], delay * 2)


def _default_client() -> Any:
    """In a pod: its service account; elsewhere: the kubeconfig (``KUBECONFIG`` read now: the
    client library reads it once, when it is first imported)."""
    import os

    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    return client.ApiClient()


def default_namespace() -> str:
    """This pod's namespace (``POD_NAMESPACE``, else its service account's), else ``default``."""
    import os

    found = os.environ.get("POD_NAMESPACE")
    if found:
        return found
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"
