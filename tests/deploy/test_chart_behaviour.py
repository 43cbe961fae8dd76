"""What the rendered chart does, for every values set: the two roles, the pools and the route
that tie them together, HA, probes, security and the config each pod reads."""

from __future__ import annotations

import base64
from typing import Any

from .support import (
    NAMESPACE,
    Manifest,
    ci_values,
    container,
    render_chart,
    selects,
    service_config,
    values_of,
)

ROUTER = "saar-extproc-router"


def _pod_labels(deployment: dict) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def _pickers(manifest: Manifest) -> list[dict]:
    return manifest.component("Deployment", "endpoint-picker")


def _saar_deployments(manifest: Manifest) -> list[dict]:
    return [manifest.get("Deployment", ROUTER), *_pickers(manifest)]


def _pool_of(manifest: Manifest, model: str) -> dict:
    pools = [p for p in manifest.of_kind("InferencePool")
             if p["metadata"]["annotations"]["saar-extproc/model"] == model]
    assert len(pools) == 1, model
    return pools[0]


def _picker_of(manifest: Manifest, model: str) -> dict:
    found = []
    for deployment in _pickers(manifest):
        args = container(deployment)["args"]
        if args[args.index("--pool-name") + 1] == model:
            found.append(deployment)
    assert len(found) == 1, model
    return found[0]


def _model_names(values: dict[str, Any]) -> list[str]:
    return [m["name"] for m in values["models"]]


# --- the two roles --------------------------------------------------------------------------

def test_router_runs_saar_serve_with_its_config(manifest: Manifest) -> None:
    router = manifest.get("Deployment", ROUTER)
    saar = container(router)
    assert saar["command"] == ["saar"]
    assert saar["args"][:3] == ["serve", "--config", "/etc/saar/config.yaml"]
    assert "--pool-name" not in saar["args"]
    volumes = {v["name"]: v for v in router["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in saar["volumeMounts"]}
    assert volumes[mounts["/etc/saar"]]["configMap"]["name"] == ROUTER
    assert "config.yaml" in manifest.get("ConfigMap", ROUTER)["data"]


def test_one_endpoint_picker_per_model(manifest: Manifest, values: dict[str, Any]) -> None:
    models = _model_names(values)
    assert len(_pickers(manifest)) == len(models)
    for model in models:
        picker = _picker_of(manifest, model)
        args = container(picker)["args"]
        assert args[:5] == ["serve", "--config", "/etc/saar/config.yaml", "--pool-name", model]
        pool = _pool_of(manifest, model)
        config = service_config(manifest, picker["metadata"]["name"])
        assert config["scheduling"]["discovery"] == {
            "mode": "kubernetes", "namespace": NAMESPACE,
            "inference_pool": pool["metadata"]["name"], "role_label": "llm-d.ai/role"}


def test_every_pool_names_a_rendered_service_that_reaches_only_its_picker(
        manifest: Manifest, values: dict[str, Any]) -> None:
    deployments = manifest.of_kind("Deployment")
    for model in _model_names(values):
        ref = _pool_of(manifest, model)["spec"]["endpointPickerRef"]
        assert ref["kind"] == "Service" and ref["port"]["number"] == values["server"]["grpcPort"]
        service = manifest.get("Service", ref["name"])     # exists in the render
        port = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
        picker = _picker_of(manifest, model)
        reached = [d["metadata"]["name"] for d in deployments
                   if selects(service["spec"]["selector"], _pod_labels(d))]
        assert reached == [picker["metadata"]["name"]]
        named = {p["name"]: p["containerPort"] for p in container(picker)["ports"]}
        assert named[port["targetPort"]] == values["server"]["grpcPort"]


def test_pools_select_the_model_servers_not_the_chart(manifest: Manifest,
                                                      values: dict[str, Any]) -> None:
    for model in values["models"]:
        spec = _pool_of(manifest, model["name"])["spec"]
        assert spec["selector"]["matchLabels"] == model["pool"]["selector"]
        assert [p["number"] for p in spec["targetPorts"]] == model["pool"]["targetPorts"]
        assert spec["endpointPickerRef"]["failureMode"] == values["epp"]["failureMode"]
        for deployment in manifest.of_kind("Deployment"):
            assert not selects(spec["selector"]["matchLabels"], _pod_labels(deployment))


def test_failure_mode_defaults_to_fail_close(default_manifest: Manifest) -> None:
    modes = {p["spec"]["endpointPickerRef"]["failureMode"]
             for p in default_manifest.of_kind("InferencePool")}
    assert modes == {"FailClose"}


def test_httproute_has_one_rule_per_model_matching_the_router_header(
        manifest: Manifest, values: dict[str, Any]) -> None:
    (route,) = manifest.of_kind("HTTPRoute")
    header = service_config(manifest, ROUTER)["routing"]["model_header"]
    assert header == values["routing"]["modelHeader"] == "x-gateway-model-name"
    by_model: dict[str, dict] = {}
    fallback = []
    for rule in route["spec"]["rules"]:
        (match,) = rule["matches"]
        if "headers" not in match:
            fallback.append(rule)
            continue
        (h,) = match["headers"]
        assert (h["type"], h["name"]) == ("Exact", header)
        assert h["value"] not in by_model
        by_model[h["value"]] = rule
    assert sorted(by_model) == sorted(_model_names(values))
    for model, rule in by_model.items():
        (backend,) = rule["backendRefs"]
        assert (backend["group"], backend["kind"]) == ("inference.networking.k8s.io",
                                                       "InferencePool")
        assert backend["name"] == _pool_of(manifest, model)["metadata"]["name"]
    assert route["spec"]["parentRefs"] == values["httpRoute"]["parentRefs"]
    default = values["httpRoute"]["defaultModel"]
    if default:
        assert route["spec"]["rules"][-1] is fallback[0]
        pool = _pool_of(manifest, default)["metadata"]["name"]
        assert fallback[0]["backendRefs"][0]["name"] == pool
    else:
        assert fallback == []


def test_model_names_that_are_not_kubernetes_names() -> None:
    manifest = render_chart(values_of("ha-redis"))
    model = "meta-llama/Llama-3.1-70B-Instruct"
    picker = _picker_of(manifest, model)
    assert picker["metadata"]["name"] == "saar-extproc-epp-meta-llama-llama-3-1-70b-instruct"
    assert _pool_of(manifest, model)["metadata"]["name"] == "llama-70b"
    assert model in service_config(manifest, ROUTER)["models"]


# --- HA ---------------------------------------------------------------------------------------

def test_replicas_and_rolling_updates(manifest: Manifest, values: dict[str, Any]) -> None:
    router = manifest.get("Deployment", ROUTER)
    assert router["spec"]["replicas"] == values["router"]["replicas"] >= 2
    for model in values["models"]:
        expected = (model.get("epp") or {}).get("replicas", values["epp"]["replicas"])
        assert _picker_of(manifest, model["name"])["spec"]["replicas"] == expected >= 2
    for deployment in _saar_deployments(manifest):
        strategy = deployment["spec"]["strategy"]
        assert strategy["type"] == "RollingUpdate"
        assert strategy["rollingUpdate"]["maxUnavailable"] == 0


def test_ha_defaults(default_manifest: Manifest) -> None:
    assert {d["spec"]["replicas"] for d in _saar_deployments(default_manifest)} == {2}
    assert len(default_manifest.of_kind("PodDisruptionBudget")) == 3


def _allowed_disruptions(max_unavailable: int | str, replicas: int) -> int:
    if isinstance(max_unavailable, str):
        return replicas * int(max_unavailable.rstrip("%")) // 100
    return max_unavailable


def test_each_deployment_has_a_pdb_that_keeps_a_replica(manifest: Manifest) -> None:
    pdbs = manifest.of_kind("PodDisruptionBudget")
    for deployment in _saar_deployments(manifest):
        labels = _pod_labels(deployment)
        mine = [p for p in pdbs if selects(p["spec"]["selector"]["matchLabels"], labels)]
        assert len(mine) == 1, deployment["metadata"]["name"]
        others = [d for d in manifest.of_kind("Deployment") if d is not deployment]
        selector = mine[0]["spec"]["selector"]["matchLabels"]
        assert not any(selects(selector, _pod_labels(d)) for d in others)
        budget = _allowed_disruptions(mine[0]["spec"]["maxUnavailable"],
                                      deployment["spec"]["replicas"])
        assert 1 <= budget < deployment["spec"]["replicas"]


def test_replicas_spread_over_zones_and_nodes(manifest: Manifest) -> None:
    for deployment in _saar_deployments(manifest):
        constraints = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert {c["topologyKey"] for c in constraints} == {"topology.kubernetes.io/zone",
                                                           "kubernetes.io/hostname"}
        for c in constraints:
            selector = c["labelSelector"]["matchLabels"]
            assert selects(selector, _pod_labels(deployment))
            spread_with = [d["metadata"]["name"] for d in manifest.of_kind("Deployment")
                           if selects(selector, _pod_labels(d))]
            assert spread_with == [deployment["metadata"]["name"]]
            assert c["whenUnsatisfiable"] == "ScheduleAnyway"


def test_probes_use_grpc_health_on_the_plaintext_health_port(
        manifest: Manifest, values: dict[str, Any]) -> None:
    """kubelet's gRPC probes cannot speak TLS: they go to the health port, which serves gRPC
    health in plaintext whatever the gRPC port speaks (the config says so to the service)."""
    for deployment in _saar_deployments(manifest):
        saar = container(deployment)
        ports = {p["name"]: p["containerPort"] for p in saar["ports"]}
        for probe, service in (("startupProbe", "liveness"), ("livenessProbe", "liveness"),
                               ("readinessProbe", "readiness")):
            spec = saar[probe]
            if values["probes"]["type"] == "http":
                assert spec["httpGet"]["path"] == "/healthz"
                assert ports[spec["httpGet"]["port"]] == values["server"]["httpPort"]
            else:
                assert spec["grpc"] == {"port": values["server"]["healthPort"],
                                        "service": service}
                assert ports["health"] == values["server"]["healthPort"]
                assert "httpGet" not in spec
        name = deployment["metadata"]["name"]
        config = service_config(manifest, name)
        assert config["server"]["health_port"] == values["server"]["healthPort"]


def test_tls_values_still_get_the_grpc_probes() -> None:
    saar = container(render_chart(values_of("default")).get("Deployment", ROUTER))
    assert saar["livenessProbe"]["grpc"] == {"port": 9003, "service": "liveness"}
    assert saar["readinessProbe"]["grpc"] == {"port": 9003, "service": "readiness"}
    plaintext = container(render_chart(values_of("plaintext")).get("Deployment", ROUTER))
    assert plaintext["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_every_container_requests_resources(manifest: Manifest) -> None:
    for deployment in manifest.of_kind("Deployment"):
        for c in deployment["spec"]["template"]["spec"]["containers"]:
            requests = c["resources"]["requests"]
            assert requests["cpu"] and requests["memory"], deployment["metadata"]["name"]
            assert c["resources"]["limits"]["memory"]


def test_pods_run_unprivileged(manifest: Manifest) -> None:
    for deployment in manifest.of_kind("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not pod.get(key)
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc.get("privileged", False) is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
            assert writable, "a read-only root filesystem needs a writable scratch volume"


def test_graceful_shutdown(manifest: Manifest) -> None:
    for deployment in _saar_deployments(manifest):
        pod = deployment["spec"]["template"]["spec"]
        sleep = container(deployment)["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert 0 < sleep < pod["terminationGracePeriodSeconds"]


# --- RBAC -------------------------------------------------------------------------------------

def test_rbac_covers_discovery_and_nothing_more(manifest: Manifest) -> None:
    (role,) = manifest.of_kind("Role")
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    watched = (("", "pods"), ("inference.networking.k8s.io", "inferencepools"))
    needed = {(g, r, v) for g, r in watched for v in ("get", "list", "watch")}
    assert granted == needed
    (binding,) = manifest.of_kind("RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    (subject,) = binding["subjects"]
    assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NAMESPACE
    for picker in _pickers(manifest):
        pod = picker["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == subject["name"]
        assert pod["automountServiceAccountToken"] is True
    router = manifest.get("Deployment", ROUTER)["spec"]["template"]["spec"]
    assert router["serviceAccountName"] != subject["name"]
    assert router["automountServiceAccountToken"] is False
    assert router["serviceAccountName"] in manifest.names("ServiceAccount")


# --- the config each pod reads ----------------------------------------------------------------

def _mounted_file(deployment: dict, path: str) -> tuple[dict, str]:
    """The volume a file path in the saar container comes from, and the file's path in it."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for mount in container(deployment)["volumeMounts"]:
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            return volumes[mount["name"]], path[len(prefix):]
    raise AssertionError(f"{path} is not mounted in {deployment['metadata']['name']}")


def _secret_key(volume: dict, file: str) -> tuple[str, str]:
    items = {i["path"]: i["key"] for i in volume["secret"]["items"]}
    return volume["secret"]["secretName"], items[file]


def test_config_files_are_mounted_where_the_config_says(manifest: Manifest,
                                                        values: dict[str, Any]) -> None:
    for deployment in _saar_deployments(manifest):
        configmap = _mounted_file(deployment, "/etc/saar/config.yaml")[0]["configMap"]["name"]
        config = service_config(manifest, configmap)
        admin = _secret_key(*_mounted_file(deployment, config["admin"]["token_file"]))
        identity = _secret_key(*_mounted_file(deployment,
                                              config["identity"]["tenant_secret_file"]))
        assert admin == (values["admin"]["existingSecret"] or "saar-extproc-admin",
                         values["admin"]["existingSecretKey"])
        assert identity == (values["identity"]["existingSecret"] or "saar-extproc-identity",
                            values["identity"]["existingSecretKey"])
        tls = config["server"]["tls"]
        assert tls["enabled"] is values["server"]["tls"]["enabled"]
        if tls["enabled"] and values["server"]["tls"]["existingSecret"]:
            for key in ("cert_file", "key_file"):
                name, item = _secret_key(*_mounted_file(deployment, tls[key]))
                assert name == values["server"]["tls"]["existingSecret"]
                assert item in ("tls.crt", "tls.key")
        else:
            assert tls["cert_file"] is None and tls["key_file"] is None


def test_config_ports_match_the_pods_and_services(manifest: Manifest) -> None:
    for deployment in _saar_deployments(manifest):
        config = service_config(manifest, deployment["metadata"]["name"])
        server = config["server"]
        assert server["host"] == "0.0.0.0"
        ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
        assert ports == {"grpc": server["grpc_port"], "http": server["http_port"],
                         "health": server["health_port"]}
        service = manifest.get("Service", deployment["metadata"]["name"])
        # The health port is kubelet's, not the Service's.
        del ports["health"]
        assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
        assert selects(service["spec"]["selector"], _pod_labels(deployment))
        grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
        assert grpc["appProtocol"] == ("http2" if server["tls"]["enabled"]
                                       else "kubernetes.io/h2c")


def test_both_roles_share_models_routing_and_state(manifest: Manifest,
                                                   values: dict[str, Any]) -> None:
    router = service_config(manifest, ROUTER)
    assert router["scheduling"] == {"enabled": False}   # the pickers pick workers
    assert sorted(router["models"]) == sorted(_model_names(values))
    for model in values["models"]:
        entry = router["models"][model["name"]]
        assert entry["cluster"] == model["name"]
        for key in ("pricing", "quality", "context_window"):
            assert entry[key] == model[key]
    assert router["routing"]["decisions"] == values["routing"]["decisions"]
    assert router["routing"]["logical_models"] == values["routing"]["logicalModels"]
    for picker in _pickers(manifest):
        config = service_config(manifest, picker["metadata"]["name"])
        for key in ("models", "routing", "state", "server", "admin", "identity"):
            assert config[key] == router[key], key
        for key, value in values["epp"]["scheduling"].items():
            assert config["scheduling"][key] == value
    assert _contains(router, values["config"])
    assert router["identity"]["tenant_secret_file"] == "/var/run/saar/identity/secret"


def _contains(big: Any, small: Any) -> bool:
    """Whether every key and value of ``small`` is in ``big`` (mappings compared deeply)."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and _contains(big[k], v)
                                             for k, v in small.items())
    return bool(big == small)


def test_state_store(rendered_all: dict[str, Manifest]) -> None:
    assert service_config(rendered_all["default"], ROUTER)["state"] == {"store": "memory"}
    ha = rendered_all["ha-redis"]
    state = service_config(ha, ROUTER)["state"]
    assert state["store"] == "redis" and state["timeout_ms"] == 50
    redis = ha.get("Service", "saar-extproc-redis")
    assert state["redis_url"] == f"redis://{redis['metadata']['name']}:{redis['spec']['ports'][0]['port']}/0"
    external = service_config(rendered_all["plaintext"], ROUTER)["state"]
    assert external == {"store": "redis", "redis_url": ci_values("plaintext")["redis"]["url"],
                        "timeout_ms": 30}


def test_bundled_redis_only_when_asked_and_only_for_the_chart(
        rendered_all: dict[str, Manifest]) -> None:
    for name in ("default", "plaintext"):
        assert rendered_all[name].component("Deployment", "redis") == []
        assert rendered_all[name].of_kind("NetworkPolicy") == []
    ha = rendered_all["ha-redis"]
    (redis,) = ha.component("Deployment", "redis")
    assert redis["spec"]["replicas"] == 1
    assert selects(ha.get("Service", "saar-extproc-redis")["spec"]["selector"], _pod_labels(redis))
    (policy,) = ha.of_kind("NetworkPolicy")
    assert selects(policy["spec"]["podSelector"]["matchLabels"], _pod_labels(redis))
    (ingress,) = policy["spec"]["ingress"]
    allowed = [d["metadata"]["name"] for d in ha.of_kind("Deployment")
               if any(selects(peer["podSelector"]["matchLabels"], _pod_labels(d))
                      for peer in ingress["from"])]
    assert sorted(allowed) == sorted(d["metadata"]["name"] for d in _saar_deployments(ha))
    assert ingress["ports"] == [{"port": 6379, "protocol": "TCP"}]


def test_generated_credentials(default_manifest: Manifest) -> None:
    again = render_chart()
    for name, key, length in (("saar-extproc-admin", "token", 48),
                              ("saar-extproc-identity", "secret", 64)):
        secret = default_manifest.get("Secret", name)
        value = base64.b64decode(secret["data"][key]).decode()
        assert len(value) == length and value.isalnum()
        assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert again.get("Secret", name)["data"][key] != secret["data"][key]   # random


def test_provided_credentials(rendered_all: dict[str, Manifest]) -> None:
    plaintext = rendered_all["plaintext"]
    secret = plaintext.get("Secret", "saar-extproc-identity")
    assert base64.b64decode(secret["data"]["secret"]).decode() == \
        ci_values("plaintext")["identity"]["tenantSecret"]
    ha = rendered_all["ha-redis"]
    assert "saar-extproc-admin" not in ha.names("Secret")   # existingSecret: nothing rendered


def test_config_changes_roll_the_pods() -> None:
    base = render_chart()
    changed = render_chart({"routing": {"logicalModels": ["auto", "fast"]}})
    for name in [ROUTER, *(p["metadata"]["name"] for p in _pickers(base))]:
        before = base.get("Deployment", name)["spec"]["template"]["metadata"]["annotations"]
        after = changed.get("Deployment", name)["spec"]["template"]["metadata"]["annotations"]
        assert before["checksum/config"] != after["checksum/config"], name


def test_metrics_are_scrapeable(manifest: Manifest, values: dict[str, Any]) -> None:
    for deployment in _saar_deployments(manifest):
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(values["server"]["httpPort"])
        assert annotations["prometheus.io/path"] == "/metrics"


def test_notes_warn_about_per_replica_memory(rendered_all: dict[str, Manifest]) -> None:
    assert "state.store is memory with more than one replica" in rendered_all["default"].notes
    assert "state.store is memory" not in rendered_all["ha-redis"].notes
