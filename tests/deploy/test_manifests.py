"""Every rendered object validates: core kinds against the Kubernetes schemas (strict), the
Gateway API and Inference Extension kinds against their upstream CRDs (schema + CEL rules).
And the validators can fail: deliberately broken objects are refused."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from . import k8s_schema
from .support import Manifest, example_objects

CUSTOM_KINDS = {"InferencePool", "HTTPRoute", "Gateway", "ServiceMonitor", "PrometheusRule"}


def test_every_object_is_a_core_kind_or_a_known_custom_resource(manifest: Manifest) -> None:
    for obj in manifest.objects:
        assert obj["kind"] in CUSTOM_KINDS or k8s_schema.is_core(obj), obj["kind"]


def test_core_objects_validate_strictly(manifest: Manifest) -> None:
    checked = 0
    for obj in manifest.objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        assert k8s_schema.core_errors(obj) == [], (obj["kind"], obj["metadata"]["name"])
        checked += 1
    assert checked >= 15


def test_custom_resources_validate_against_upstream_crds(manifest: Manifest,
                                                         crd_validator) -> None:
    custom = [o for o in manifest.objects if o["kind"] in CUSTOM_KINDS]
    assert {"InferencePool", "HTTPRoute"} <= {o["kind"] for o in custom}
    for obj in custom:
        report = crd_validator.validate(obj)
        assert report.errors == [], (obj["kind"], obj["metadata"]["name"])
        if obj["kind"] in ("InferencePool", "HTTPRoute"):     # CRDs with rules on these nodes
            assert report.rules_evaluated > 0, "CEL rules were not run"
        assert report.skipped == []


def test_example_gateway_api_objects_validate(crd_validator) -> None:
    seen = set()
    for name, objects in example_objects().items():
        for obj in objects:
            assert k8s_schema.metadata_errors(obj) == [], (name, obj["kind"])
            if crd_validator.knows(obj):
                report = crd_validator.validate(obj)
                assert report.errors == [], (name, obj["kind"], obj["metadata"]["name"])
                seen.add(obj["kind"])
    assert "Gateway" in seen


# --- the validators fail on broken objects ----------------------------------------------------

def _router(manifest: Manifest) -> dict:
    return copy.deepcopy(manifest.get("Deployment", "saar-extproc-router"))


def _break_replicas(d: dict) -> None:
    d["spec"]["replicas"] = "two"


def _break_unknown_field(d: dict) -> None:
    d["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}


def _break_no_containers(d: dict) -> None:
    del d["spec"]["template"]["spec"]["containers"]


def _break_bad_port(d: dict) -> None:
    d["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "grpc"


@pytest.mark.parametrize("mutate", [_break_replicas, _break_unknown_field, _break_no_containers,
                                    _break_bad_port])
def test_broken_core_objects_fail(default_manifest: Manifest,
                                  mutate: Callable[[dict], None]) -> None:
    deployment = _router(default_manifest)
    assert k8s_schema.core_errors(deployment) == []
    mutate(deployment)
    assert k8s_schema.core_errors(deployment) != []


@pytest.mark.parametrize(("kind", "name", "value"), [
    ("Service", "9lives", "a Service name must be a DNS-1035 label"),
    ("Service", "a" * 64, "a Service name must be a DNS-1035 label"),
    ("ConfigMap", "Upper_Case", "must be a DNS-1123 subdomain"),
])
def test_bad_names_fail(kind: str, name: str, value: str) -> None:
    errors = k8s_schema.metadata_errors({"kind": kind, "metadata": {"name": name}})
    assert any(value in e for e in errors)


def test_bad_labels_fail() -> None:
    meta = {"name": "ok", "labels": {"app": "x" * 64, "bad key/": "v", "-x": "v"}}
    errors = k8s_schema.metadata_errors({"kind": "ConfigMap", "metadata": meta})
    for bad in ("'app'", "'bad key/'", "'-x'"):
        assert any(bad in e for e in errors), (bad, errors)
    assert not any("'ok'" in e for e in errors)


def _pool(manifest: Manifest) -> dict:
    return copy.deepcopy(manifest.of_kind("InferencePool")[0])


def _route(manifest: Manifest) -> dict:
    return copy.deepcopy(manifest.of_kind("HTTPRoute")[0])


def _set(path: str, value: Any) -> Callable[[dict], None]:
    def mutate(obj: dict) -> None:
        *parents, last = path.split(".")
        node = obj
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        if value is _DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return mutate


_DELETE = object()

BROKEN_POOLS = [
    ("duplicate target ports (CEL)", _set("spec.targetPorts", [{"number": 8000}] * 2),
     "port number must be unique"),
    ("picker without port: kind defaults to Service (defaulting + CEL)",
     _set("spec.endpointPickerRef", {"name": "epp"}), "port is required when kind is 'Service'"),
    ("unknown failure mode", _set("spec.endpointPickerRef.failureMode", "Sometimes"),
     "is not one of"),
    ("no selector", _set("spec.selector", _DELETE), "'selector' is a required property"),
    ("unknown field (strict)", _set("spec.endpointPicker", {}), "'endpointPicker' was unexpected"),
    ("nine target ports", _set("spec.targetPorts", [{"number": 8000 + i} for i in range(9)]),
     "is too long"),
    ("bad label value in the selector",
     _set("spec.selector.matchLabels", {"app": "no spaces"}), "does not match"),
    ("bad name", _set("metadata.name", "Pool_1"), "DNS-1123 subdomain"),
]

BROKEN_ROUTES = [
    ("a Service backend without port (CEL)",
     _set("spec.rules.0.backendRefs", [{"name": "svc"}]), "Must have port for Service reference"),
    ("seventeen rules", lambda r: r["spec"].__setitem__("rules", r["spec"]["rules"] * 9),
     "is too long"),
    ("a path with // (CEL)",
     _set("spec.rules.0.matches.0.path", {"type": "PathPrefix", "value": "/v1//chat"}),
     "must not contain '//'"),
    ("the same header twice in one match (list-type map)",
     lambda r: r["spec"]["rules"][0]["matches"][0]["headers"].append(
         dict(r["spec"]["rules"][0]["matches"][0]["headers"][0])),
     "duplicate entry"),
    ("two parentRefs to one Gateway, neither with a sectionName (CEL, __namespace__)",
     _set("spec.parentRefs", [{"name": "gw"}, {"name": "gw"}]),
     "sectionName must be unique"),
    ("two parentRefs to one Gateway, one without a sectionName (CEL)",
     _set("spec.parentRefs", [{"name": "gw", "sectionName": "http"}, {"name": "gw"}]),
     "sectionName must be specified"),
    ("backend timeout longer than the request's (CEL duration)",
     _set("spec.rules.0.timeouts", {"request": "10s", "backendRequest": "1m"}),
     "backendRequest timeout cannot be longer than request timeout"),
    ("unknown header match type", _set("spec.rules.0.matches.0.headers.0.type", "Prefix"),
     "is not one of"),
]


@pytest.mark.parametrize(("case", "mutate", "message"), BROKEN_POOLS,
                         ids=[c[0] for c in BROKEN_POOLS])
def test_broken_inference_pools_fail(default_manifest: Manifest, crd_validator, case: str,
                                     mutate: Callable[[dict], None], message: str) -> None:
    pool = _pool(default_manifest)
    assert crd_validator.validate(pool).ok
    mutate(pool)
    errors = crd_validator.validate(pool).errors
    assert any(message in e for e in errors), (case, errors)


@pytest.mark.parametrize(("case", "mutate", "message"), BROKEN_ROUTES,
                         ids=[c[0] for c in BROKEN_ROUTES])
def test_broken_httproutes_fail(default_manifest: Manifest, crd_validator, case: str,
                                mutate: Callable[[dict], None], message: str) -> None:
    route = _route(default_manifest)
    assert crd_validator.validate(route).ok
    mutate(route)
    errors = crd_validator.validate(route).errors
    assert any(message in e for e in errors), (case, errors)


def test_unknown_custom_kind_is_refused(crd_validator) -> None:
    obj = {"apiVersion": "inference.networking.k8s.io/v1alpha9", "kind": "InferencePool",
           "metadata": {"name": "p"}, "spec": {}}
    assert not crd_validator.knows(obj)
    assert "no served CRD version" in crd_validator.validate(obj).errors[0]
