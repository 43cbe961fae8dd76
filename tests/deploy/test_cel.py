"""The CEL evaluator behind the CRD checks: every rule of the upstream CRDs compiles and calls
only functions it implements, and rules behave as the API server's on crafted objects."""

from __future__ import annotations

from typing import Any

import pytest

from . import k8s_schema


def test_every_crd_rule_compiles_and_uses_only_supported_functions(crd_validator) -> None:
    assert len(crd_validator.rules) > 100
    unsupported = {}
    for crd, path, rule in crd_validator.rules:
        k8s_schema.compile_rule(rule)   # raises on a syntax cel-python does not parse
        missing = k8s_schema.unsupported_functions(rule)
        if missing:
            unsupported[f"{crd} {path}"] = sorted(missing)
    assert unsupported == {}, f"CEL functions this evaluator lacks: {unsupported}"


def test_no_transition_rules_are_left_unevaluated(crd_validator) -> None:
    """Rules reading oldSelf only run on update; the shared CRDs have none."""
    assert [r for _, _, r in crd_validator.rules if "oldSelf" in r] == []


def test_unsupported_functions_are_detected() -> None:
    assert k8s_schema.unsupported_functions("isIP(self.address) && self.size() > 0") == {"isIP"}
    assert k8s_schema.unsupported_functions("self.matches('isIP(x)')") == set()


@pytest.mark.parametrize(("name", "escaped"), [
    ("namespace", "__namespace__"),
    ("in", "__in__"),
    ("sectionName", "sectionName"),
    ("x-gateway", "x__dash__gateway"),
    ("a.b/c", "a__dot__b__slash__c"),
    ("a__b", "a__underscores__b"),
    ("1abc", None),
])
def test_property_names_are_escaped_like_the_api_server(name: str, escaped: str | None) -> None:
    assert k8s_schema.escape_property(name) == escaped


@pytest.mark.parametrize(("rule", "value", "expected"), [
    ("self.split('/') == ['a', 'b', 'c']", "a/b/c", True),
    ("self.split('/', 2) == ['a', 'b/c']", "a/b/c", True),
    ("self.split('/', 0) == []", "a/b", True),
    ("self.split('/')[0].size() < 5", "prefix/name", False),
    ("self.lowerAscii() == 'post' && self.upperAscii() == 'POST'", "PoSt", True),
    ("self.matches(r'''^[a-z]+$''')", "abc", True),
    ("duration(self) > duration('90s')", "2m", True),
])
def test_string_functions(rule: str, value: str, expected: bool) -> None:
    assert k8s_schema.evaluate_rule(rule, value, {"type": "string"}) == (expected, None)


def test_an_error_in_a_rule_fails_it() -> None:
    passed, problem = k8s_schema.evaluate_rule("self.missing == 'x'", {"other": 1},
                                                {"type": "object", "properties": {}})
    assert not passed and problem and "error" in problem


def _gateway(listeners: list[dict], **spec: Any) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": "llm"},
            "spec": {"gatewayClassName": "eg", "listeners": listeners, **spec}}


def _route(parent_refs: list[dict]) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "r", "namespace": "llm"},
            "spec": {"parentRefs": parent_refs,
                     "rules": [{"backendRefs": [{"name": "svc", "port": 80}]}]}}


HTTP = {"name": "http", "protocol": "HTTP", "port": 80}

CASES = [
    ("one listener", _gateway([HTTP]), None),
    ("two listeners with one name", _gateway([HTTP, {**HTTP, "port": 81}]),
     "Listener name must be unique"),
    ("HTTP listener with tls", _gateway([{**HTTP, "tls": {"mode": "Terminate"}}]),
     "tls must not be specified"),
    ("TLS listener without a mode",
     _gateway([{"name": "tls", "protocol": "TLS", "port": 443, "hostname": "a.example"}]),
     "tls mode must be set for protocol TLS"),
    ("infrastructure label with a 253+ character prefix (split)",
     _gateway([HTTP], infrastructure={"labels": {"a" * 253 + "/b": "v"}}),
     "label key's prefix must be a DNS subdomain not longer than 253"),
    ("infrastructure label with a short prefix",
     _gateway([HTTP], infrastructure={"labels": {"x.io/b": "v"}}), None),
    ("parentRefs to one Gateway name in two namespaces (__namespace__)",
     _route([{"name": "gw", "namespace": "a"}, {"name": "gw", "namespace": "b"}]), None),
    ("parentRefs to one Gateway in one namespace, no sectionName",
     _route([{"name": "gw", "namespace": "a"}, {"name": "gw", "namespace": "a"}]),
     "sectionName must be unique"),
    ("parentRefs to two listeners of one Gateway",
     _route([{"name": "gw", "sectionName": "a"}, {"name": "gw", "sectionName": "b"}]), None),
]


@pytest.mark.parametrize(("case", "obj", "message"), CASES, ids=[c[0] for c in CASES])
def test_crd_rules_on_crafted_objects(crd_validator, case: str, obj: dict,
                                      message: str | None) -> None:
    report = crd_validator.validate(obj)
    if message is None:
        assert report.errors == [], case
    else:
        assert any(message in e for e in report.errors), (case, report.errors)


def test_defaults_are_applied_before_the_rules() -> None:
    schema = {"type": "object", "properties": {
        "kind": {"type": "string", "default": "Service"},
        "port": {"type": "object", "properties": {"number": {"type": "integer"}}}}}
    data = k8s_schema.apply_defaults(schema, {"name": "epp"})
    assert data == {"name": "epp", "kind": "Service"}
    assert k8s_schema.evaluate_rule("self.kind != 'Service' || has(self.port)", data, schema) \
        == (False, None)
