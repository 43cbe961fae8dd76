"""What the rendered chart does, for every values set: the two roles, the pools and the route
that tie them together, HA, probes, security and the config each pod reads."""

from __future__ import annotations

import base64
from typing import Any

import helm_python
import pytest

from .support import (
    NAMESPACE,
    Manifest,
    ci_values,
    container,
    provision_job,
    render_chart,
    run_provision,
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
                path = "/readyz" if service == "readiness" else "/healthz"
                assert spec["httpGet"]["path"] == path
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
    assert plaintext["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert plaintext["livenessProbe"]["httpGet"]["path"] == "/healthz"


def _workloads(manifest: Manifest) -> list[dict]:
    """Every Deployment and Job of the render: each pod the chart runs."""
    return manifest.of_kind("Deployment") + manifest.of_kind("Job")


def test_every_container_requests_resources(manifest: Manifest) -> None:
    for deployment in _workloads(manifest):
        for c in deployment["spec"]["template"]["spec"]["containers"]:
            requests = c["resources"]["requests"]
            assert requests["cpu"] and requests["memory"], deployment["metadata"]["name"]
            assert c["resources"]["limits"]["memory"]


def test_pods_run_unprivileged(manifest: Manifest) -> None:
    for deployment in _workloads(manifest):
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


def test_graceful_shutdown(manifest: Manifest, values: dict[str, Any]) -> None:
    """The preStop sleep, then the service's drain (the notice, the wait for the streams in
    flight, a second to stop) all end before kubelet's SIGKILL; each pod's config has the
    drain the values give."""
    given = values["server"]["drain"]
    for deployment in _saar_deployments(manifest):
        pod = deployment["spec"]["template"]["spec"]
        sleep = container(deployment)["lifecycle"]["preStop"]["sleep"]["seconds"]
        drain = service_config(manifest, deployment["metadata"]["name"])["server"]["drain"]
        assert drain == {"notice_seconds": given["noticeSeconds"],
                         "timeout_seconds": given["timeoutSeconds"]}
        needs = sleep + drain["notice_seconds"] + drain["timeout_seconds"] + 1
        assert sleep > 0
        assert needs < pod["terminationGracePeriodSeconds"]


# --- RBAC -------------------------------------------------------------------------------------

def test_rbac_covers_discovery_and_nothing_more(manifest: Manifest) -> None:
    (role,) = manifest.component("Role", "endpoint-picker")
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    watched = (("", "pods"), ("inference.networking.k8s.io", "inferencepools"))
    needed = {(g, r, v) for g, r in watched for v in ("get", "list", "watch")}
    assert granted == needed
    (binding,) = manifest.component("RoleBinding", "endpoint-picker")
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
        if tls["enabled"]:   # yours, else the provisioned one (provision is on in every set)
            for key in ("cert_file", "key_file"):
                name, item = _secret_key(*_mounted_file(deployment, tls[key]))
                assert name == (values["server"]["tls"]["existingSecret"]
                                or "saar-extproc-grpc-tls")
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


def test_every_replicated_role_shares_a_store(manifest: Manifest) -> None:
    """The locks survive a turn that reaches another replica: every role with more than one
    replica (all of them, by default) reads and writes the same store."""
    urls = set()
    for deployment in _saar_deployments(manifest):
        assert deployment["spec"]["replicas"] >= 2
        state = service_config(manifest, deployment["metadata"]["name"])["state"]
        assert state["store"] == "redis", deployment["metadata"]["name"]
        urls.add(state["redis_url"])
    assert len(urls) == 1


def test_state_store(rendered_all: dict[str, Manifest]) -> None:
    for name in ("default", "ha-redis"):
        manifest = rendered_all[name]
        state = service_config(manifest, ROUTER)["state"]
        assert state["store"] == "redis" and state["timeout_ms"] == 50
        redis = manifest.get("Service", "saar-extproc-redis")
        port = redis["spec"]["ports"][0]["port"]
        assert state["redis_url"] == f"redis://{redis['metadata']['name']}:{port}/0"
    external = service_config(rendered_all["plaintext"], ROUTER)["state"]
    assert external == {"store": "redis", "redis_url": ci_values("plaintext")["redis"]["url"],
                        "timeout_ms": 30}


def test_a_cluster_url_reaches_the_config_and_passes_its_schema() -> None:
    from extproc.config import parse_config

    url = "redis+cluster://cache-0.cache.svc:6379,cache-1.cache.svc:6379"
    config = service_config(render_chart({"redis": {"url": url}}), ROUTER)
    assert config["state"]["redis_url"] == url
    assert parse_config(config).state.redis_url == url


@pytest.mark.parametrize(("values", "message"), [
    ({"redis": {"enabled": False}}, "router.replicas=2: without a shared store"),
    ({"redis": {"enabled": False}, "router": {"replicas": 1}},
     "the endpoint picker of qwen3-8b has 2 replicas: without a shared store"),
    ({"redis": {"enabled": False}, "router": {"replicas": 1}, "epp": {"replicas": 1},
      "models": [{"name": "m", "pool": {"selector": {"app": "m"}, "targetPorts": [8000]},
                  "epp": {"replicas": 3}}],
      "routing": {"decisions": [{"name": "d", "modelRefs": [{"model": "m"}]}]}},
     "the endpoint picker of m has 3 replicas"),
])
def test_replicas_without_a_store_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError) as caught:
        render_chart(values)
    assert message in str(caught.value)


def test_one_replica_each_runs_without_a_store() -> None:
    single = {"replicas": 1, "pdb": {"enabled": False, "maxUnavailable": 1}}
    manifest = render_chart({"redis": {"enabled": False}, "router": single, "epp": single})
    assert manifest.component("Deployment", "redis") == []
    assert service_config(manifest, ROUTER)["state"] == {"store": "memory"}
    assert "Shared state: none (every role runs one replica)" in manifest.notes


def test_bundled_redis_only_when_asked_and_only_for_the_chart(
        rendered_all: dict[str, Manifest]) -> None:
    plaintext = rendered_all["plaintext"]          # redis.url: no bundled one
    assert plaintext.component("Deployment", "redis") == []
    assert plaintext.component("NetworkPolicy", "redis") == []
    for name in ("default", "ha-redis"):
        _bundled_redis_reached_only_by_the_chart(rendered_all[name])


def _bundled_redis_reached_only_by_the_chart(ha: Manifest) -> None:
    (redis,) = ha.component("Deployment", "redis")
    assert redis["spec"]["replicas"] == 1
    assert selects(ha.get("Service", "saar-extproc-redis")["spec"]["selector"], _pod_labels(redis))
    (policy,) = ha.component("NetworkPolicy", "redis")
    assert selects(policy["spec"]["podSelector"]["matchLabels"], _pod_labels(redis))
    (ingress,) = policy["spec"]["ingress"]
    allowed = [d["metadata"]["name"] for d in ha.of_kind("Deployment")
               if any(selects(peer["podSelector"]["matchLabels"], _pod_labels(d))
                      for peer in ingress["from"])]
    assert sorted(allowed) == sorted(d["metadata"]["name"] for d in _saar_deployments(ha))
    assert ingress["ports"] == [{"port": 6379, "protocol": "TCP"}]


def test_renders_draw_nothing_random(values_name: str) -> None:
    """A GitOps tool renders with `helm template` at every sync, where `lookup` sees no
    cluster: two renders are the same, so nothing (token, tenant secret, certificate)
    rotates; the provision Job makes what is missing, once."""
    assert render_chart(values_of(values_name)).objects == \
        render_chart(values_of(values_name)).objects


def test_the_provision_job_makes_what_the_pods_mount(manifest: Manifest,
                                                     values: dict[str, Any], tmp_path) -> None:
    """Every Secret a pod mounts is rendered, the operator's (an existingSecret), or made by
    the provision Job with the keys the pod reads."""
    made = run_provision(manifest, tmp_path)
    rendered = manifest.names("Secret")
    yours = {values["admin"]["existingSecret"], values["identity"]["existingSecret"],
             values["server"]["tls"]["existingSecret"]} - {""}
    for deployment in _saar_deployments(manifest):
        for volume in deployment["spec"]["template"]["spec"]["volumes"]:
            if "secret" not in volume:
                continue
            name = volume["secret"]["secretName"]
            if name in rendered or name in yours:
                assert ("Secret", name) not in made.objects, name
                continue
            assert ("Secret", name) in made.objects, (deployment["metadata"]["name"], name)
            keys = {i["key"] for i in volume["secret"]["items"]}
            assert keys <= set(made.data("Secret", name)), (name, keys)
    for (_, name), _obj in made.objects.items():      # nothing it makes is rendered too
        assert name not in manifest.names("Secret")


def test_generated_credentials(default_manifest: Manifest, tmp_path) -> None:
    assert default_manifest.of_kind("Secret") == []
    made = run_provision(default_manifest, tmp_path)
    for name, key in (("saar-extproc-admin", "token"), ("saar-extproc-identity", "secret")):
        value = made.data("Secret", name)[key]
        assert len(value) == 48 and value.isalnum()
    again = run_provision(default_manifest, tmp_path)
    assert again.data("Secret", "saar-extproc-identity") != \
        made.data("Secret", "saar-extproc-identity")              # random per namespace...
    kept = run_provision(default_manifest, tmp_path, existing=list(made.objects.values()))
    assert kept.objects == made.objects                         # ...and never changed after
    assert all(r[0] == "GET" for r in kept.requests)


def test_the_provision_job_runs_as_a_hook_with_just_enough_rights(
        manifest: Manifest, tmp_path) -> None:
    job = provision_job(manifest)
    assert job is not None
    hook = job["metadata"]["annotations"]
    assert hook["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert "hook-succeeded" in hook["helm.sh/hook-delete-policy"]
    pod = job["spec"]["template"]["spec"]
    assert container(job)["image"] == container(manifest.get("Deployment", ROUTER))["image"]
    (role,) = manifest.component("Role", "provision")
    (binding,) = manifest.component("RoleBinding", "provision")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    for obj in (role, binding, manifest.get("ServiceAccount", pod["serviceAccountName"])):
        assert int(obj["metadata"]["annotations"]["helm.sh/hook-weight"]) < \
            int(hook["helm.sh/hook-weight"])            # in place before the Job runs
    # Every request the Job made, first run and second, is one its Role allows.
    made = run_provision(manifest, tmp_path)
    again = run_provision(manifest, tmp_path, existing=list(made.objects.values()))
    for method, path in made.requests + again.requests:
        parts = path.split("?")[0].split("/")       # /api/v1/namespaces/NS/KIND[/NAME]
        resource, name = parts[5], (parts[6] if len(parts) > 6 else None)
        verb = {"GET": "get", "PUT": "update", "POST": "create"}[method]
        assert _allows(role, resource, verb, name), (method, path)
    assert not _allows(role, "secrets", "get", "someone-elses-secret")
    assert not _allows(role, "secrets", "delete", "saar-extproc-admin")


def _allows(role: dict, resource: str, verb: str, name: str | None) -> bool:
    return any(resource in rule["resources"] and verb in rule["verbs"]
               and ((name is None and "resourceNames" not in rule)
                    or (name is not None and name in rule.get("resourceNames", [name])))
               for rule in role["rules"])


def test_provided_credentials(rendered_all: dict[str, Manifest], tmp_path) -> None:
    plaintext = rendered_all["plaintext"]
    secret = plaintext.get("Secret", "saar-extproc-identity")
    assert base64.b64decode(secret["data"]["secret"]).decode() == \
        ci_values("plaintext")["identity"]["tenantSecret"]
    ha = rendered_all["ha-redis"]
    assert "saar-admin" not in ha.names("Secret")           # existingSecret: nothing rendered
    made = run_provision(ha, tmp_path)                      # ... nor provisioned
    assert {name for _, name in made.objects} == {"saar-extproc-identity"}


def test_without_provision_every_credential_is_yours() -> None:
    with pytest.raises(helm_python.HelmRenderError, match=r"admin: with provision\.enabled=false"):
        render_chart({"provision": {"enabled": False}})
    manifest = render_chart({"provision": {"enabled": False},
                             "admin": {"existingSecret": "a"},
                             "identity": {"existingSecret": "i"}})
    assert provision_job(manifest) is None
    tls = service_config(manifest, ROUTER)["server"]["tls"]
    assert tls == {"enabled": True, "cert_file": None, "key_file": None}   # self-signed per pod


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


def test_notes_say_where_state_and_credentials_are(rendered_all: dict[str, Manifest]) -> None:
    notes = rendered_all["default"].notes
    assert "Shared state: the bundled Valkey saar-extproc-redis" in notes
    assert "signed by the CA in ConfigMap and Secret saar-extproc-grpc-ca" in notes
    assert "Shared state: redis.url" in rendered_all["plaintext"].notes


def test_service_monitor_scrapes_the_router_and_every_picker(
        rendered_all: dict[str, Manifest]) -> None:
    manifest = rendered_all["ha-redis"]
    (monitor,) = manifest.of_kind("ServiceMonitor")
    spec = monitor["spec"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (expression,) = spec["selector"]["matchExpressions"]
    scraped = []
    for service in manifest.of_kind("Service"):
        labels = service["metadata"]["labels"]
        if selects(spec["selector"]["matchLabels"], labels) and \
                labels[expression["key"]] in expression["values"]:
            scraped.append(service["metadata"]["name"])
            ports = {p["name"] for p in service["spec"]["ports"]}
            assert {e["port"] for e in spec["endpoints"]} <= ports
    assert sorted(scraped) == sorted(d["metadata"]["name"] for d in _saar_deployments(manifest))
    (endpoint,) = spec["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert rendered_all["default"].of_kind("ServiceMonitor") == []


def test_the_dashboard_config_map_is_the_dashboard(rendered_all: dict[str, Manifest]) -> None:
    import json

    from .support import ROOT

    manifest = rendered_all["ha-redis"]
    board = manifest.get("ConfigMap", "saar-extproc-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    shipped = (ROOT / "deploy" / "grafana" / "saar-dashboard.json").read_text()
    assert json.loads(board["data"]["saar-extproc.json"]) == json.loads(shipped)
    assert "saar-extproc-dashboard" not in rendered_all["default"].names("ConfigMap")
