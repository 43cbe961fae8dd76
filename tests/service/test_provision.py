"""``saar provision`` against a stand-in API server: what a release lacks is created, what it
has is never touched (so a GitOps sync, which renders without ``lookup``, rotates nothing),
and the certificate it makes verifies against the CA it publishes, for the router's names."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from extproc.service.provision import TOKEN_CHARS, Certificate, Plan, Provisioner, RandomSecret
from tests.deploy.fake_api import FakeApiServer, fake_api

NS = "llm"
NAMES = ("saar-extproc-router", "saar-extproc-router.llm.svc.cluster.local")
PLAN = Plan(NS, (RandomSecret("saar-extproc-admin", "token"),
                 RandomSecret("saar-extproc-identity", "secret")),
            Certificate("saar-extproc-grpc-tls", "saar-extproc-grpc-ca", NAMES, days=30),
            {"app.kubernetes.io/instance": "saar-extproc"})


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with fake_api() as server:
        yield server


def _run(api: FakeApiServer, plan: Plan = PLAN) -> list[str]:
    return Provisioner(api.core_api(), plan).run()


def _data(api: FakeApiServer, plural: str, name: str) -> dict[str, str]:
    obj = api.objects[(NS, plural, name)]
    data = obj["data"]
    return ({k: base64.b64decode(v).decode() for k, v in data.items()}
            if plural == "secrets" else dict(data))


def _secret(name: str, data: dict[str, str], kind: str = "Opaque") -> dict:
    return {"kind": "Secret", "type": kind, "metadata": {"name": name},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def test_an_empty_namespace_gets_every_object(api: FakeApiServer) -> None:
    done = _run(api)
    assert sorted(api.objects) == sorted([
        (NS, "secrets", "saar-extproc-admin"), (NS, "secrets", "saar-extproc-identity"),
        (NS, "secrets", "saar-extproc-grpc-tls"), (NS, "secrets", "saar-extproc-grpc-ca"),
        (NS, "configmaps", "saar-extproc-grpc-ca")])
    assert all(line.endswith(": created") for line in done), done
    for name, key in (("saar-extproc-admin", "token"), ("saar-extproc-identity", "secret")):
        value = _data(api, "secrets", name)[key]
        assert len(value) == TOKEN_CHARS and value.isalnum()
        assert api.objects[(NS, "secrets", name)]["type"] == "Opaque"
    assert (_data(api, "secrets", "saar-extproc-admin")["token"]
            != _data(api, "secrets", "saar-extproc-identity")["secret"])
    tls = api.objects[(NS, "secrets", "saar-extproc-grpc-tls")]
    assert tls["type"] == "kubernetes.io/tls"
    assert tls["metadata"]["labels"] == {"app.kubernetes.io/instance": "saar-extproc"}
    pair = _data(api, "secrets", "saar-extproc-grpc-tls")
    assert set(pair) == {"tls.crt", "tls.key", "ca.crt"}
    assert _data(api, "configmaps", "saar-extproc-grpc-ca") == {"ca.crt": pair["ca.crt"]}
    assert _data(api, "secrets", "saar-extproc-grpc-ca") == {"ca.crt": pair["ca.crt"]}
    assert "PRIVATE KEY" not in pair["ca.crt"]


def test_the_certificate_is_the_routers_signed_by_the_published_ca(api: FakeApiServer) -> None:
    _run(api)
    pair = _data(api, "secrets", "saar-extproc-grpc-tls")
    ca = x509.load_pem_x509_certificate(pair["ca.crt"].encode())
    leaf = x509.load_pem_x509_certificate(pair["tls.crt"].encode())
    leaf.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert tuple(names.get_values_for_type(x509.DNSName)) == NAMES
    usage = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    days = (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days
    assert days == 30


def test_a_second_run_changes_nothing(api: FakeApiServer) -> None:
    _run(api)
    before = {k: dict(v) for k, v in api.objects.items()}
    writes = len([r for r in api.requests if r[0] != "GET"])
    done = _run(api)
    assert api.objects == before
    assert len([r for r in api.requests if r[0] != "GET"]) == writes   # reads only
    assert all("exists, kept" in line for line in done), done


def test_objects_made_before_are_kept(api: FakeApiServer) -> None:
    """An earlier chart's generated Secret (or one given by hand) keeps its value."""
    api.put(NS, _secret("saar-extproc-identity", {"secret": "the-tenant-key-of-2025"}))
    _run(api)
    assert _data(api, "secrets", "saar-extproc-identity") == {"secret": "the-tenant-key-of-2025"}


def test_a_kept_certificate_gets_its_ca_published(api: FakeApiServer) -> None:
    api.put(NS, _secret("saar-extproc-grpc-tls", {"tls.crt": "C", "tls.key": "K",
                                                  "ca.crt": "THE-CA"}, "kubernetes.io/tls"))
    done = _run(api)
    assert _data(api, "configmaps", "saar-extproc-grpc-ca") == {"ca.crt": "THE-CA"}
    assert _data(api, "secrets", "saar-extproc-grpc-ca") == {"ca.crt": "THE-CA"}
    assert _data(api, "secrets", "saar-extproc-grpc-tls")["tls.crt"] == "C"
    assert "Secret saar-extproc-grpc-tls: exists, kept" in done


def test_a_certificate_without_its_ca_is_kept_and_said_so(api: FakeApiServer) -> None:
    api.put(NS, _secret("saar-extproc-grpc-tls", {"tls.crt": "C", "tls.key": "K"},
                        "kubernetes.io/tls"))
    done = _run(api)
    assert (NS, "configmaps", "saar-extproc-grpc-ca") not in api.objects
    assert any("has no ca.crt" in line for line in done)


def test_a_deleted_certificate_comes_back_with_a_new_ca_in_place_of_the_old(
        api: FakeApiServer) -> None:
    _run(api)
    old_ca = _data(api, "configmaps", "saar-extproc-grpc-ca")["ca.crt"]
    del api.objects[(NS, "secrets", "saar-extproc-grpc-tls")]
    done = _run(api)
    pair = _data(api, "secrets", "saar-extproc-grpc-tls")
    assert pair["ca.crt"] != old_ca
    assert _data(api, "configmaps", "saar-extproc-grpc-ca") == {"ca.crt": pair["ca.crt"]}
    assert _data(api, "secrets", "saar-extproc-grpc-ca") == {"ca.crt": pair["ca.crt"]}
    assert any("replaced" in line for line in done)


def test_a_create_that_loses_a_race_keeps_the_winners_object(api: FakeApiServer) -> None:
    api.put(NS, _secret("saar-extproc-admin", {"token": "the-winner"}))
    api.unseen.add("saar-extproc-admin")      # our read comes before the other run's create
    done = _run(api, Plan(NS, (RandomSecret("saar-extproc-admin", "token"),)))
    assert _data(api, "secrets", "saar-extproc-admin") == {"token": "the-winner"}
    assert done == ["Secret saar-extproc-admin: made meanwhile by another run, kept"]
