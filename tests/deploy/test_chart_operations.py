"""The chart's operations options (issue 32), for every values set and for
``ci/operations-values.yaml``, which turns them all on: a model's own config keys, extra args
that the real ``saar`` parser takes, the log level and format as values, mutual TLS on the gRPC
port, a NetworkPolicy for every role, the alert rules as a PrometheusRule and a provision Job
that gives up before Helm does."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .support import (
    ROOT,
    Manifest,
    container,
    provision_job,
    render_chart,
    selects,
    service_config,
)

ROUTER = "saar-extproc-router"
HELM_TIMEOUT = 300
"""``helm install``'s default --timeout, in seconds: how long it waits for a hook Job."""


def _saar_deployments(manifest: Manifest) -> list[dict]:
    return [manifest.get("Deployment", ROUTER),
            *manifest.component("Deployment", "endpoint-picker")]


def _pod_labels(deployment: dict) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def _config_of(manifest: Manifest, deployment: dict) -> dict[str, Any]:
    return service_config(manifest, deployment["metadata"]["name"])


def _model(name: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "pool": {"selector": {"app": name}, "targetPorts": [8000]}, **more}


# --- models[].config --------------------------------------------------------------------------

def test_a_models_own_config_keys_reach_both_roles() -> None:
    """Keys of a model's entry go into that entry in every role's config, beside the cluster
    the chart sets (the schema no longer requires `cluster` there and forbids it)."""
    from extproc.config import parse_config

    models = [_model("a", config={"strip_volatile_preambles": True,
                                  "context_window": 65536}),
              _model("b", context_window=32768, config={"context_window": 1})]
    decisions = [{"name": "d", "modelRefs": [{"model": "a"}, {"model": "b"}]}]
    manifest = render_chart({"models": models, "routing": {"decisions": decisions}})
    for deployment in _saar_deployments(manifest):
        data = _config_of(manifest, deployment)
        assert data["models"]["a"] == {"cluster": "a", "strip_volatile_preambles": True,
                                       "context_window": 65536}
        assert data["models"]["b"]["context_window"] == 32768   # the entry's own key wins
        config = parse_config({k: v for k, v in data.items() if k != "admin"})
        assert config.models["a"].strip_volatile_preambles is True


# --- extra args --------------------------------------------------------------------------------

def test_every_command_line_parses_with_the_real_cli(manifest: Manifest,
                                                     values: dict[str, Any]) -> None:
    """What each container runs is a command line `saar` accepts: extra args come after the
    command and its options (`saar serve --config F -v`), where the parser takes them."""
    from extproc.cli import build_parser

    parser = build_parser()
    job = provision_job(manifest)
    for workload in [*_saar_deployments(manifest), *([job] if job else [])]:
        saar = container(workload)
        assert saar["command"] == ["saar"]
        parsed = parser.parse_args(saar["args"])      # SystemExit(2) on an unknown argument
        if workload["kind"] == "Deployment":
            assert parsed.config == "/etc/saar/config.yaml"
            role = "router" if workload["metadata"]["name"] == ROUTER else "epp"
            extra = values[role]["extraArgs"]
            assert saar["args"][len(saar["args"]) - len(extra):] == extra
            assert parsed.verbose is bool({"-v", "--verbose"} & set(extra))


def test_extra_args_after_the_command_reach_it() -> None:
    from extproc.cli import build_parser

    manifest = render_chart({"router": {"extraArgs": ["-v", "--health-port", "9103"]}})
    parsed = build_parser().parse_args(container(manifest.get("Deployment", ROUTER))["args"])
    assert (parsed.command, parsed.verbose, parsed.health_port) == ("serve", True, 9103)


# --- logs ---------------------------------------------------------------------------------------

def test_the_log_level_and_format_are_values(manifest: Manifest,
                                             values: dict[str, Any]) -> None:
    for deployment in _saar_deployments(manifest):
        assert _config_of(manifest, deployment)["logging"] == values["logging"]


def test_json_logs_parse_as_the_services_logging_section() -> None:
    from extproc.config import parse_config

    manifest = render_chart({"logging": {"level": "warning", "format": "json"}})
    data = service_config(manifest, ROUTER)
    config = parse_config({k: v for k, v in data.items() if k != "admin"})
    assert (config.logging.level, config.logging.format) == ("warning", "json")


# --- trust: mutual TLS, the HTTP port's address --------------------------------------------------

def _mounted(deployment: dict, path: str) -> tuple[dict, str]:
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for mount in container(deployment)["volumeMounts"]:
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            return volumes[mount["name"]], path[len(prefix):]
    raise AssertionError(f"{path} is not mounted in {deployment['metadata']['name']}")


def test_mutual_tls_mounts_the_client_ca_where_the_config_reads_it(
        manifest: Manifest, values: dict[str, Any]) -> None:
    ca = values["server"]["tls"]["clientCA"]
    for deployment in _saar_deployments(manifest):
        tls = _config_of(manifest, deployment)["server"]["tls"]
        picker = deployment["metadata"]["name"] != ROUTER
        wanted = bool(values["server"]["tls"]["enabled"]
                      and (ca["existingConfigMap"] or ca["existingSecret"])
                      and (ca["pickers"] or not picker))
        names = {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
        if not wanted:
            assert "client_ca_file" not in tls and "client-ca" not in names
            continue
        volume, file = _mounted(deployment, tls["client_ca_file"])
        source = volume.get("configMap") or volume["secret"]
        assert source.get("name", source.get("secretName")) == (ca["existingConfigMap"]
                                                                 or ca["existingSecret"])
        assert {i["path"]: i["key"] for i in source["items"]} == {file: ca["key"]}


def test_mutual_tls_from_a_secret_on_the_router_only() -> None:
    manifest = render_chart({"server": {"tls": {"clientCA": {"existingSecret": "gw-ca",
                                                             "key": "ca.pem"}}}})
    router = manifest.get("Deployment", ROUTER)
    volume, file = _mounted(router, service_config(manifest, ROUTER)["server"]["tls"]
                            ["client_ca_file"])
    assert volume["secret"]["secretName"] == "gw-ca"
    assert volume["secret"]["items"] == [{"key": "ca.pem", "path": file}]
    for picker in manifest.component("Deployment", "endpoint-picker"):
        assert "client_ca_file" not in _config_of(manifest, picker)["server"]["tls"]
    plaintext = render_chart({"server": {"tls": {"enabled": False,
                                                 "clientCA": {"existingSecret": "gw-ca"}}}})
    assert "client_ca_file" not in service_config(plaintext, ROUTER)["server"]["tls"]


def test_the_http_port_listens_where_probes_and_scrapes_come_from(
        manifest: Manifest, values: dict[str, Any]) -> None:
    """The service binds its HTTP port to loopback by default; in a pod kubelet's HTTP
    probes and Prometheus come from outside, so the chart binds server.httpHost (0.0.0.0 by
    default) and its NetworkPolicy says who may reach it."""
    assert render_chart().objects and values["server"]["httpHost"]
    for deployment in _saar_deployments(manifest):
        server = _config_of(manifest, deployment)["server"]
        assert server["http_host"] == values["server"]["httpHost"]
    from extproc.config import Server

    assert Server().http_host == "127.0.0.1"


# --- NetworkPolicies -----------------------------------------------------------------------------

def _port_names(deployment: dict) -> set[str]:
    return {p["name"] for p in container(deployment)["ports"]}


def test_a_network_policy_for_every_role(manifest: Manifest, values: dict[str, Any]) -> None:
    """Each role's pods are selected by a policy of their own that admits their own ports and
    no other: gRPC from networkPolicy.grpcFrom, HTTP from httpFrom (absent: anywhere), the
    health port from anywhere (kubelet)."""
    policies = manifest.of_kind("NetworkPolicy")
    workloads = [*_saar_deployments(manifest), *manifest.component("Deployment", "redis")]
    for deployment in workloads:
        mine = [p for p in policies
                if selects(p["spec"]["podSelector"]["matchLabels"], _pod_labels(deployment))]
        component = _pod_labels(deployment)["app.kubernetes.io/component"]
        enabled = (values["redis"]["networkPolicy"]["enabled"] if component == "redis"
                   else values["networkPolicy"]["enabled"])
        if not enabled:
            assert mine == [], deployment["metadata"]["name"]
            continue
        assert len(mine) == 1, deployment["metadata"]["name"]
        (policy,) = mine
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        if component == "redis":
            continue
        rules = {port["port"]: rule.get("from") for rule in policy["spec"]["ingress"]
                 for port in rule["ports"]}
        assert set(rules) == _port_names(deployment)
        net = values["networkPolicy"]
        assert rules == {"grpc": net["grpcFrom"] or None, "http": net["httpFrom"] or None,
                         "health": None}


def test_network_policies_are_optional() -> None:
    manifest = render_chart({"networkPolicy": {"enabled": False}})
    assert manifest.names("NetworkPolicy") == {"saar-extproc-redis"}


# --- the alert rules ------------------------------------------------------------------------------

RULES = ROOT / "deploy" / "prometheus" / "saar-alerts.yaml"


def _job_matches(expr: str) -> tuple[str, str]:
    match = re.search(r'namespace="([^"]+)", job=~"([^"]+)"', expr)
    assert match, expr
    return match.group(1), match.group(2)


def test_the_alert_rules_as_a_prometheus_rule(rendered_all: dict[str, Manifest]) -> None:
    """The PrometheusRule carries deploy/prometheus/saar-alerts.yaml, its job="saar-extproc"
    matched to the jobs the ServiceMonitor makes: one per Service (the router's, each
    picker's), in the release's namespace."""
    manifest = rendered_all["operations"]
    (rule,) = manifest.of_kind("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rendered = rule["spec"]["groups"]
    assert [g["name"] for g in rendered] == [g["name"] for g in groups]
    replaced = 0
    for group, ours in zip(groups, rendered, strict=True):
        for original, got in zip(group["rules"], ours["rules"], strict=True):
            if 'job="saar-extproc"' in original["expr"]:
                namespace, jobs = _job_matches(got["expr"])
                assert namespace == "llm"
                services = [s["metadata"]["name"] for s in manifest.of_kind("Service")
                            if s["metadata"]["labels"]["app.kubernetes.io/component"]
                            in ("router", "endpoint-picker")]
                assert len(services) == 3
                assert all(re.fullmatch(jobs, name) for name in services)
                assert not re.fullmatch(jobs, "saar-extproc-redis")
                replaced += 1
                original = {**original, "expr": got["expr"]}
            assert got == original
    assert replaced >= 1
    for name, other in rendered_all.items():
        if name != "operations":
            assert other.of_kind("PrometheusRule") == []


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_the_rendered_rules_load_in_prometheus(rendered_all: dict[str, Manifest],
                                               tmp_path: Path) -> None:
    (rule,) = rendered_all["operations"].of_kind("PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    custom = render_chart({"metrics": {"prometheusRule": {
        "enabled": True, "jobSelector": 'cluster="eu-1", service=~"saar-extproc-.+"'}}})
    (rule,) = custom.of_kind("PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any('up{cluster="eu-1", service=~"saar-extproc-.+"}' in e for e in exprs)


# --- the image and the provision Job --------------------------------------------------------------

def test_the_provision_job_gives_up_before_helm_does(manifest: Manifest,
                                                     values: dict[str, Any]) -> None:
    """An image the cluster cannot pull leaves the hook's pod in ImagePullBackOff: the Job's
    deadline fails `helm install` after provision.activeDeadlineSeconds (2 minutes by
    default), not at Helm's 5-minute timeout."""
    job = provision_job(manifest)
    if job is None:
        return
    spec = job["spec"]
    assert spec["activeDeadlineSeconds"] == values["provision"]["activeDeadlineSeconds"]
    assert spec["activeDeadlineSeconds"] < HELM_TIMEOUT
    assert spec["backoffLimit"] == values["provision"]["backoffLimit"]
    assert render_chart().of_kind("Job")[0]["spec"]["activeDeadlineSeconds"] == 120
