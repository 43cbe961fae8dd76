"""The credentials a Helm release needs, created where they are missing and never changed once
they exist (``saar provision``, the chart's hook Job, at every install and upgrade). Helm's
``lookup`` sees no cluster under ``helm template`` (Argo CD), so a chart that generated them
itself would draw new ones at every sync; this keeps the admin token, the tenant secret (which
keys every session id) and the certificate of the first install for good.

* ``RandomSecret``: an Opaque Secret holding ``TOKEN_CHARS`` random letters and digits;
* ``Certificate``: a CA of the release's own signs a server certificate for the router's DNS
  names. Secret ``secret`` (``kubernetes.io/tls``: ``tls.crt``, ``tls.key``, ``ca.crt``) is
  what the pods mount; the CA alone, ``ca.crt`` in ConfigMap and Secret ``ca``, is what a
  gateway verifies the router with (a BackendTLSPolicy reads a ConfigMap, Istio's
  DestinationRule a Secret). The CA's key is not kept: a new certificate comes with a new CA
  (delete the Secret, run again), and the CA objects follow it.

A Secret or ConfigMap that exists is left as it is (an ``existingSecret``, one made by an
earlier chart version, one an operator rotated by hand); one created by another run meanwhile
(409) counts as existing.
"""

from __future__ import annotations

import base64
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .tls import issue

TOKEN_CHARS = 48
_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True)
class RandomSecret:
    name: str
    key: str


@dataclass(frozen=True)
class Certificate:
    secret: str
    ca: str
    dns_names: tuple[str, ...]
    days: int = 3650


@dataclass(frozen=True)
class Plan:
    namespace: str
    randoms: tuple[RandomSecret, ...] = ()
    certificate: Certificate | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


def random_token() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(TOKEN_CHARS))


class Provisioner:
    """Runs a ``Plan`` against the API server with the official client's ``CoreV1Api``."""

    def __init__(self, core: Any, plan: Plan) -> None:
        self._core = core
        self._plan = plan
        self.done: list[str] = []
        """What this run did, one line per object (kept or created)."""

    def run(self) -> list[str]:
        for wanted in self._plan.randoms:
            self._random(wanted)
        if self._plan.certificate is not None:
            self._certificate(self._plan.certificate)
        return self.done

    # -- the two kinds -----------------------------------------------------------------------

    def _random(self, wanted: RandomSecret) -> None:
        if self._read("secret", wanted.name) is not None:
            self.done.append(f"Secret {wanted.name}: exists, kept")
            return
        body = self._object("Secret", wanted.name, {wanted.key: random_token()}, "Opaque")
        self._create("secret", body)

    def _certificate(self, wanted: Certificate) -> None:
        existing = self._read("secret", wanted.secret)
        if existing is not None:
            self.done.append(f"Secret {wanted.secret}: exists, kept")
            ca = _decoded(existing).get("ca.crt")
            if ca is None:
                self.done.append(f"Secret {wanted.secret} has no ca.crt: the CA objects "
                                 f"{wanted.ca} are not made (give them yourself)")
                return
            for kind in ("secret", "config_map"):
                if self._read(kind, wanted.ca) is None:
                    self._create(kind, self._ca_object(kind, wanted.ca, ca))
                else:
                    self.done.append(f"{_KINDS[kind]} {wanted.ca}: exists, kept")
            return
        issued = issue(wanted.dns_names, wanted.days)
        pair = {"tls.crt": issued.certificate.decode(), "tls.key": issued.key.decode(),
                "ca.crt": issued.ca.decode()}
        # The CA first: a gateway that sees the new certificate already trusts its CA.
        for kind in ("config_map", "secret"):
            self._put(kind, self._ca_object(kind, wanted.ca, issued.ca.decode()))
        self._create("secret", self._object("Secret", wanted.secret, pair, "kubernetes.io/tls"))

    # -- API calls ---------------------------------------------------------------------------

    def _read(self, kind: str, name: str) -> Any | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return getattr(self._core, f"read_namespaced_{kind}")(name, self._plan.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _create(self, kind: str, body: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        name = body["metadata"]["name"]
        try:
            getattr(self._core, f"create_namespaced_{kind}")(self._plan.namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.done.append(f"{_KINDS[kind]} {name}: made meanwhile by another run, kept")
            return
        self.done.append(f"{_KINDS[kind]} {name}: created")

    def _put(self, kind: str, body: dict[str, Any]) -> None:
        """Create, or replace what is there (the CA of a certificate that is gone)."""
        name = body["metadata"]["name"]
        if self._read(kind, name) is None:
            self._create(kind, body)
            return
        getattr(self._core, f"replace_namespaced_{kind}")(name, self._plan.namespace, body)
        self.done.append(f"{_KINDS[kind]} {name}: replaced (a new CA for a new certificate)")

    # -- bodies ------------------------------------------------------------------------------

    def _object(self, kind: str, name: str, data: Mapping[str, str],
                secret_type: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": kind,
            "metadata": {"name": name, "namespace": self._plan.namespace,
                         "labels": dict(self._plan.labels)},
        }
        if kind == "Secret":
            body["type"] = secret_type or "Opaque"
            body["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        else:
            body["data"] = dict(data)
        return body

    def _ca_object(self, kind: str, name: str, ca: str) -> dict[str, Any]:
        return self._object(_KINDS[kind], name, {"ca.crt": ca})


_KINDS = {"secret": "Secret", "config_map": "ConfigMap"}


def _decoded(secret: Any) -> dict[str, str]:
    data = secret.data or {}
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def core_api(kubeconfig: str | None = None) -> Any:
    """``CoreV1Api`` for this pod's service account, else the kubeconfig's current context."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig)
    return client.CoreV1Api()
