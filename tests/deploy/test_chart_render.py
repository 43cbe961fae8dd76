"""The chart lints and renders offline (helm-python-sdk: Helm's Go SDK, no helm binary), and its
values schema and template checks refuse inconsistent values."""

from __future__ import annotations

import copy
import json
from typing import Any

import helm_python
import pytest

from .support import CHART, VALUES_FILES, render_chart, values_of


def _model(name: str) -> dict[str, Any]:
    return {"name": name, "pool": {"selector": {"app": "model-server"}, "targetPorts": [8000]}}


@pytest.mark.parametrize("name", sorted(VALUES_FILES))
def test_lint_is_clean(name: str) -> None:
    report = helm_python.lint(CHART, values_of(name), strict=True, kube_version="v1.37.0")
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]   # warnings and errors
    assert problems == [], problems


def test_every_values_set_renders_the_same_kinds_of_object(rendered_all) -> None:
    kinds = {name: {o["kind"] for o in m.objects} for name, m in rendered_all.items()}
    base = {"ConfigMap", "Deployment", "Service", "ServiceAccount", "Role", "RoleBinding",
            "PodDisruptionBudget", "InferencePool", "HTTPRoute"}
    for name, found in kinds.items():
        assert base <= found, (name, base - found)
    assert "Job" in kinds["default"] and "Secret" not in kinds["default"]   # provisioned
    assert "Secret" in kinds["plaintext"]                                   # given as values
    assert "NetworkPolicy" in kinds["default"] and "NetworkPolicy" in kinds["plaintext"]
    assert {"ServiceMonitor", "ConfigMap"} <= kinds["ha-redis"]
    assert "ServiceMonitor" not in kinds["default"]
    assert "PrometheusRule" in kinds["operations"] and "PrometheusRule" not in kinds["default"]


@pytest.mark.parametrize(("values", "message"), [
    ({"router": {"replicas": 0}}, "/router/replicas"),
    ({"epp": {"failureMode": "Sometimes"}}, "/epp/failureMode"),
    ({"bogus": True}, "bogus"),
    ({"models": []}, "/models"),
    ({"models": [{"name": "m"}]}, "pool"),
    ({"models": [{"name": "m", "pool": {"selector": {}, "targetPorts": [8000]}}]}, "selector"),
    ({"models": [{"name": "m", "pool": {"selector": {"app": "m"}, "targetPorts": [0]}}]},
     "targetPorts"),
    ({"models": [_model(f"m{i}") for i in range(17)]}, "/models"),
    ({"config": {"server": {"grpc_port": 1}}}, "/config/server"),
    ({"config": {"scheduling": {"discovery": {"mode": "static"}}}}, "/config/scheduling"),
    ({"router": {"config": {"state": {"store": "memory"}}}}, "/router/config/state"),
    ({"router": {"resources": {"requests": None}}}, "requests"),   # null drops the default
    ({"probes": {"type": "exec"}}, "/probes/type"),
    ({"redis": {"url": "http://not-redis:6379"}}, "/redis/url"),
    ({"routing": {"modelHeader": "bad header"}}, "/routing/modelHeader"),
    ({"image": {"digest": "sha256:short"}}, "/image/digest"),
    # The service's own config model: a typo, a range, a type, a key the chart owns.
    ({"config": {"limts": {"max_body_bytes": 1024}}}, "additional properties 'limts'"),
    ({"config": {"limits": {"max_body_byte": 1024}}}, "additional properties 'max_body_byte'"),
    ({"config": {"memory": {"session_ttl_seconds": 0}}}, "/config/memory/session_ttl_seconds"),
    ({"config": {"health": {"failure_threshold": "3"}}}, "/config/health/failure_threshold"),
    ({"config": {"identity": {"tenant_secret_file": "/x"}}}, "/config/identity"),
    ({"router": {"config": {"limts": {}}}}, "/router/config"),
    ({"epp": {"config": {"scheduling": {"admission": {"enabled": "yes"}}}}}, "/epp/config"),
    ({"epp": {"scheduling": {"scorerz": {}}}}, "/epp/scheduling"),
    ({"epp": {"scheduling": {"discovery": {"mode": "static"}}}}, "/epp/scheduling"),
    ({"routing": {"decisions": [{"name": "d", "modelRefs": [{"model": "qwen3-8b"}],
                                 "rules": {"keyword": ["x"]}}]}}, "/routing/decisions/0"),
    ({"models": [{**_model("m"), "quality": 2}]}, "/models/0/quality"),
    ({"models": [{**_model("m"), "config": {"endpoints": ["no-port"]}}]}, "/models/0/config"),
    ({"models": [{**_model("m"), "config": {"cluster": "mine"}}]},   # the chart's
     "additional properties 'cluster'"),
    ({"models": [{**_model("m"), "config": {"qualty": 0.5}}]}, "additional properties 'qualty'"),
    ({"logging": {"format": "xml"}}, "/logging/format"),
    ({"logging": {"level": "verbose"}}, "/logging/level"),
    ({"config": {"logging": {"format": "json"}}}, "/config/logging"),   # logging.format is
    ({"server": {"tls": {"clientCA": {"existingConfigMap": "a", "existingSecret": "b"}}}},
     "/server/tls/clientCA"),                                           # one CA, not two
    ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
    ({"metrics": {"prometheusRule": {"enabled": True, "label": {}}}}, "/metrics/prometheusRule"),
    ({"provision": {"activeDeadlineSeconds": 0}}, "/provision/activeDeadlineSeconds"),
    ({"metrics": {"serviceMonitor": {"interval": "soon"}}}, "/metrics/serviceMonitor/interval"),
    ({"provision": {"certificateDays": 0}}, "/provision/certificateDays"),
])
def test_values_schema_rejects(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match="schema") as caught:
        render_chart(values)
    assert message in str(caught.value)


@pytest.mark.parametrize(("values", "message"), [
    ({"models": [_model("a"), _model("a")]}, 'models: "a" is listed twice'),
    ({"models": [_model("Qwen/X"), _model("qwen-x")]}, 'same Kubernetes name "qwen-x"'),
    ({"models": [_model("///")]}, "no character usable"),
    ({"routing": {"decisions": [{"name": "d", "modelRefs": [{"model": "gpt-9"}]}]}},
     'unknown model "gpt-9"'),
    ({"httpRoute": {"defaultModel": "gpt-9"}}, "is not the name of a model"),
    ({"terminationGracePeriodSeconds": 30}, "terminationGracePeriodSeconds=30: the drain needs "
     "more (preStopSleepSeconds 5 + server.drain.noticeSeconds 2 + "
     "server.drain.timeoutSeconds 75 + 1 s to stop = 83 s)"),
    ({"server": {"drain": {"noticeSeconds": 1.5, "timeoutSeconds": 82.5}}}, "= 90 s"),
])
def test_template_checks_refuse(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError) as caught:
        render_chart(values)
    assert message in str(caught.value)


def test_sixteen_models_and_a_default_rule_overflow_the_httproute() -> None:
    models = [_model(f"m{i}") for i in range(16)]
    decisions = [{"name": "d", "modelRefs": [{"model": "m0"}]}]
    render_chart({"models": models, "routing": {"decisions": decisions}})   # 16 rules fit
    with pytest.raises(helm_python.HelmRenderError, match="at most 16 rules"):
        render_chart({"models": models, "routing": {"decisions": decisions},
                      "httpRoute": {"defaultModel": "m0"}})


def test_the_schema_of_the_config_values_is_the_config_models() -> None:
    """values.schema.json's config parts are generated from extproc.config (run
    `python -m extproc.dev.chart_schema` after changing the config model)."""
    from extproc.dev.chart_schema import SCHEMA_FILE, render

    assert SCHEMA_FILE == CHART / "values.schema.json"
    current = SCHEMA_FILE.read_text()
    assert current == render(json.loads(current))


def test_the_generated_schema_follows_the_config_model() -> None:
    """The schema is derived, not copied: a key of the model is in it, with its range."""
    from extproc.dev.chart_schema import generate

    schema = generate(json.loads((CHART / "values.schema.json").read_text()))
    limits = schema["definitions"]["saar.Limits"]
    assert limits["additionalProperties"] is False
    assert limits["properties"]["max_body_bytes"]["minimum"] == 1
    assert schema["properties"]["config"]["properties"]["server"] is False


def test_values_the_service_accepts_pass_the_schema() -> None:
    """The keys of config/example.yaml the chart does not own render (the schema is not
    stricter than the service)."""
    import yaml

    from .support import ROOT

    example = yaml.safe_load((ROOT / "config" / "example.yaml").read_text())
    owned = ("server", "state", "admin", "models", "routing")
    config = {k: v for k, v in example.items() if k not in owned}
    config.get("scheduling", {}).pop("discovery", None)
    assert config, "config/example.yaml has keys beyond the chart's own"
    render_chart({"config": config})


def test_two_releases_in_one_namespace_share_no_object_name() -> None:
    first, second = render_chart(release="alpha"), render_chart(release="beta")
    for kind in {o["kind"] for o in first.objects}:
        assert not first.names(kind) & second.names(kind), kind


def test_user_values_do_not_leak_between_renders() -> None:
    values = copy.deepcopy(values_of("ha-redis"))
    render_chart(values)
    assert values == values_of("ha-redis")
