"""Renders the Envoy bootstrap that puts the processor in front of the model clusters, or
the fragment of it an existing Envoy needs (``fragment``: the two ext_proc filters, the
processor clusters and the routes that use them).

The checked-in ``envoy/envoy.yaml`` is this output for ``config/example.yaml``; the demo, the
tests and the benchmark render their own with the ports they use, so there is one source of truth.
The output is plain YAML (no anchors: a copied part stands on its own). With
``server.tls.enabled`` the processor clusters speak TLS, verified when ``ProcessorTls`` names
the CA, with a client certificate when it names one (``server.tls.client_ca_file``).
``GET /v1/models`` is answered by Envoy from the config (``apis.models``): the logical models
clients send and the physical ones, with their context windows.
"""

from __future__ import annotations

import ipaddress
import json
import math
from dataclasses import dataclass
from typing import Any

import yaml

from ..apis.models import model_card, model_list, model_names
from ..config import Config
from ..errors import document
from .contract import (
    DESTINATION_HEADER,
    DIAGNOSTIC_HEADERS,
    ERROR_KEY,
    LB_NAMESPACE,
    METADATA_NAMESPACE,
    MODEL_RETRIES,
    OBSERVE_FILTER,
    OBSERVE_HEADER,
    OBSERVER,
    PROCESSOR,
    RENDERS_KEY,
    ROUTING_FILTER,
    SUBSET_NAMESPACE,
    UPSTREAM_ATTRIBUTE,
    WORKER_HEADER,
)

EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
"""The gRPC health service a picker's readiness is asked by (the Endpoint Picker Protocol)."""
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
BUFFER_LIMIT = 32 * 1024 * 1024
ROUTER_DOWN_RETRY_AFTER = 2
"""Seconds a client is told to wait when the processor cannot be reached (a restart takes
about two: the SDKs' two default retries then span it)."""
ANTHROPIC_PATHS = "/v1/messages"

LOCAL_REPLIES: tuple[tuple[int, int, str, str], ...] = (
    # Envoy's status, the status sent, the code, the message (Envoy's own text substituted).
    (413, 413, "body_too_large",
     f"the request body is over the proxy's buffer limit of {BUFFER_LIMIT} bytes"),
    (500, 503, "router_unavailable",
     "the router could not be reached; the request was not sent to a model, retry shortly"),
    (503, 503, "upstream_unavailable",
     "no model server answered: %LOCAL_REPLY_BODY%"),
    (504, 504, "upstream_timeout", "the model server did not answer in time: %LOCAL_REPLY_BODY%"),
)
"""Errors Envoy makes itself, as the clients' SDKs expect them (``local_reply_config``): by
status, in Anthropic's format on its paths and for its SDK, OpenAI's elsewhere. A 500 of
Envoy's own is the routing filter failing closed (the processor down or restarting): it
becomes a 503 with ``Retry-After``. Every other local error keeps its status, in the same
shapes (code ``proxy_error``)."""


@dataclass(frozen=True)
class ProcessorTls:
    """TLS to the processor: the certificate checked against ``ca_file`` for ``server_name``
    (default: the first processor's host) when a CA is given, else encryption only. With
    ``client_cert_file`` / ``client_key_file`` Envoy presents that client certificate (what a
    processor with ``server.tls.client_ca_file`` asks for: mutual TLS)."""

    ca_file: str | None = None
    server_name: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("client_cert_file and client_key_file go together")


@dataclass(frozen=True)
class EnvoyPorts:
    listen: int = 10000
    admin: int = 9901
    processor_host: str = "127.0.0.1"
    processor_port: int = 9002
    replicas: tuple[int, ...] = ()
    """More processor replicas' gRPC ports on ``processor_host``: Envoy balances the streams
    over all of them (round robin), which share their state through the store."""
    listen_host: str = "127.0.0.1"
    more_processors: tuple[str, ...] = ()
    """Replicas elsewhere, as ``host:port``."""
    processor_tls: ProcessorTls | None = None
    """How to reach a processor that serves TLS; None: encrypted, not verified."""

    @property
    def processors(self) -> tuple[str, ...]:
        """Every processor replica's ``host:port``, each once."""
        own = (f"{_host(self.processor_host)}:{port}"
               for port in (self.processor_port, *self.replicas))
        return tuple(dict.fromkeys((*own, *self.more_processors)))


class _PlainDumper(yaml.SafeDumper):
    """Writes a value as often as it appears: no ``&id001`` / ``*id001``."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(document: dict[str, Any]) -> str:
    return yaml.dump(document, Dumper=_PlainDumper, sort_keys=False)


def render(config: Config, ports: EnvoyPorts, *, access_log: str | None = None) -> str:
    return dump(bootstrap(config, ports, access_log=access_log))


def bootstrap(
    config: Config, ports: EnvoyPorts, *, access_log: str | None = None
) -> dict[str, Any]:
    default_cluster = next(iter(config.models.values())).cluster
    hcm: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "ingress",
        "codec_type": "AUTO",
        # One spelling per path before any filter (the processor canonicalises the same way):
        # //v1, /v1/./chat, %2F never reach a default cluster as something unrecognised.
        "normalize_path": True,
        "merge_slashes": True,
        "path_with_escaped_slashes_action": "UNESCAPE_AND_FORWARD",
        "local_reply_config": local_reply_config(),
        "route_config": {
            "name": "models",
            "virtual_hosts": [
                {
                    "name": "models",
                    "domains": ["*"],
                    # Remove first: an upstream must never be able to forge our diagnostics.
                    "response_headers_to_remove": [*DIAGNOSTIC_HEADERS, WORKER_HEADER],
                    "response_headers_to_add": [
                        _add_header(name, f"%DYNAMIC_METADATA({METADATA_NAMESPACE}:{key})%")
                        for name, key in DIAGNOSTIC_HEADERS.items()
                    ]
                    + [_add_header(WORKER_HEADER, "%UPSTREAM_REMOTE_ADDRESS%")],
                    "routes": [
                        *processor_routes(config),
                        {
                            "match": {"prefix": "/"},
                            "route": {"cluster": default_cluster},
                            "typed_per_filter_config": _observe_off(),
                        },
                    ],
                }
            ],
        },
        "http_filters": [_routing_filter(renders=True, hold=max_message_timeout(config)),
                         _observe_filter(), _router_filter()],
    }
    if access_log:
        hcm["access_log"] = [_access_log(access_log)]
    return {
        # The admin port can reconfigure Envoy: never expose it beyond loopback.
        "admin": {"address": _address("127.0.0.1", ports.admin)},
        "static_resources": {
            "listeners": [
                {
                    "name": "llm",
                    "address": _address(ports.listen_host, ports.listen),
                    "per_connection_buffer_limit_bytes": BUFFER_LIMIT,
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": processor_clusters(config, ports)
            + [
                _model_cluster(model.cluster, model.addresses)
                for model in config.models.values() if model.base is None  # adapters share it
            ],
        },
    }


def fragment(config: Config, ports: EnvoyPorts) -> dict[str, Any]:
    """What an existing Envoy adds to run the processor: the two filters (before its router
    filter, in this order), the processor clusters, and the routes (before its own: the
    models list, and the routed requests by the model cluster the processor names)."""
    return {
        "http_filters": [_routing_filter(renders=False, hold=max_message_timeout(config)),
                         _observe_filter()],
        "clusters": processor_clusters(config, ports),
        "routes": processor_routes(config),
    }


FRAGMENT_NOTES = """\
# saar-extproc for an existing Envoy ({source}).
# http_filters: in your HttpConnectionManager, before envoy.filters.http.router, in this order.
# clusters: beside yours; your model clusters must be named as models.*.cluster ({clusters}).
# routes: at the top of your virtual host: GET /v1/models answered from the config, then the
#   requests the processor routed (header {header}) to the cluster it names. Routes of yours
#   below them should turn the observe filter off (typed_per_filter_config as in these), or
#   their answers are streamed past the processor for nothing.
# Also: per_connection_buffer_limit_bytes >= {buffer} on the listener and the model clusters
#   (whole agent contexts are buffered), normalize_path and merge_slashes on the manager.
"""


def render_fragment(config: Config, ports: EnvoyPorts, *, source: str = "config") -> str:
    notes = FRAGMENT_NOTES.format(
        source=source, clusters=", ".join(m.cluster for m in config.models.values()),
        header=config.routing.cluster_header, buffer=BUFFER_LIMIT)
    return notes + dump(fragment(config, ports))


def processor_clusters(config: Config, ports: EnvoyPorts) -> list[dict[str, Any]]:
    tls = ports.processor_tls or ProcessorTls() if config.server.tls.enabled else None
    return [_processor_cluster(PROCESSOR, ports, tls), _processor_cluster(OBSERVER, ports, tls)]


def processor_routes(config: Config) -> list[dict[str, Any]]:
    """The models list, then the requests the processor routed to a model's cluster."""
    cluster_header = config.routing.cluster_header
    return [
        *models_routes(config),
        # Streamed answers: the observe filter reads them without holding them.
        {
            "match": {
                "prefix": "/",
                "headers": [
                    {"name": cluster_header, "present_match": True},
                    {"name": OBSERVE_HEADER, "present_match": True},
                ],
            },
            "route": _model_route(cluster_header),
        },
        {
            "match": {
                "prefix": "/",
                "headers": [{"name": cluster_header, "present_match": True}],
            },
            "route": _model_route(cluster_header),
            "typed_per_filter_config": _observe_off(),
        },
    ]


def models_routes(config: Config) -> list[dict[str, Any]]:
    """``GET /v1/models`` and ``GET /v1/models/{id}``, answered by Envoy from the config."""
    answers = [("/v1/models", model_list(config))]
    answers += [(f"/v1/models/{name}", model_card(config, name)) for name in model_names(config)]
    return [
        {
            "name": "models" if path == "/v1/models" else f"model-{body['id']}",
            "match": {"path": path,
                      "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
            "direct_response": {"status": 200, "body": {
                "inline_string": json.dumps(body, separators=(",", ":"))}},
            "response_headers_to_add": [_add_header("content-type", "application/json")],
            "typed_per_filter_config": _observe_off(),
        }
        for path, body in answers
    ]


def _model_route(cluster_header: str) -> dict[str, Any]:
    """A routed model request: no timeout (an answer may take minutes), retried by Envoy."""
    return {"cluster_header": cluster_header, "timeout": "0s", "retry_policy": retry_policy()}


def retry_policy() -> dict[str, Any]:
    """Ride out a worker's short outage before the client sees it. Retried: a connection that
    fails or is reset before the answer's headers, and 502 / 503 / 529 (the answers model
    health counts as unavailable, less 504: a timed-out generation is too dear to redo).
    Never after the answer started — Envoy forwards the headers of an attempt that answered,
    and a streamed answer is past the point of retry from its first byte. No per-try
    timeout: a non-streamed answer's headers come only after its whole generation, so one
    would cut and re-run healthy long answers. Each attempt goes to the next host of the
    processor's pick (its fallbacks); a hard lock lists its issuer once per attempt."""
    return {
        "retry_on": "connect-failure,refused-stream,reset,retriable-status-codes",
        "retriable_status_codes": [502, 503, 529],
        "num_retries": MODEL_RETRIES,
        "retry_back_off": {"base_interval": "0.1s", "max_interval": "1s"},
    }


def local_reply_config() -> dict[str, Any]:
    """Mappers for the errors Envoy makes itself; the processor's own (marked with
    ``saar.error`` metadata) are left as they are — the first mapper matches them and
    rewrites nothing."""
    ours = {"metadata_filter": {
        "matcher": {"filter": METADATA_NAMESPACE, "path": [{"key": ERROR_KEY}],
                    "value": {"present_match": True}},
        "match_if_key_not_found": False}}
    anthropic = {"or_filter": {"filters": [
        {"header_filter": {"header": {"name": ":path",
                                      "string_match": {"prefix": ANTHROPIC_PATHS}}}},
        {"header_filter": {"header": {"name": "anthropic-version", "present_match": True}}},
    ]}}
    mappers: list[dict[str, Any]] = [{"filter": ours}]
    for style, match in (("anthropic", anthropic), ("openai", None)):
        for status, sent, code, message in LOCAL_REPLIES:
            mappers.append(_mapper(style, match, _status("EQ", status), status, sent, code,
                                   message))
        for floor in (500, 400):  # the rest, keeping their status
            mappers.append(_mapper(style, match, _status("GE", floor), floor, floor,
                                   "proxy_error", "%LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)"))
    return {"mappers": mappers}


def _status(op: str, status: int) -> dict[str, Any]:
    return {"status_code_filter": {"comparison": {"op": op, "value": {
        "default_value": status, "runtime_key": f"saar.local_reply.{op.lower()}_{status}"}}}}


def _mapper(style: str, match: dict[str, Any] | None, test: dict[str, Any], status: int,
            sent: int, code: str, message: str) -> dict[str, Any]:
    """Local replies matching ``test`` (and ``match``, when given) as ``style``'s error body
    for ``sent`` (sent instead of ``status`` when they differ)."""
    mapper: dict[str, Any] = {
        "filter": test if match is None else {"and_filter": {"filters": [match, test]}},
        "body_format_override": {
            "json_format": document(style, sent, code, message),
            "content_type": "application/json",
        },
    }
    if sent != status:
        mapper["status_code"] = sent
    if code == "router_unavailable":
        mapper["headers_to_add"] = [
            _add_header("retry-after", str(ROUTER_DOWN_RETRY_AFTER)),
            _add_header("x-should-retry", "true"),
        ]
    return mapper


def _observe_off() -> dict[str, Any]:
    return {
        OBSERVE_FILTER: {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3."
            "ExtProcPerRoute",
            "disabled": True,
        }
    }


def longest_hold(config: Config) -> float:
    """The longest the processor may hold a request's message: a flow-control class's queue
    TTL, admission's hold. Envoy's ``max_message_timeout`` must outlast it, or Envoy ignores
    the hold (its override is out of range) and answers 504 after ``message_timeout``."""
    holds = [0.0]
    flow, admission = config.scheduling.flow_control, config.scheduling.admission
    if flow.enabled:
        holds += [c.ttl_seconds for c in flow.classes.values()]
    if admission.enabled and admission.on_paused == "hold":
        holds.append(admission.hold_timeout_seconds)
    return max(holds)


def max_message_timeout(config: Config) -> str:
    """Envoy's bound on a held message: 60 s, or longer where a hold is (``hold_reply`` asks
    for the hold rounded up and a second more)."""
    return f"{max(60, math.ceil(longest_hold(config)) + 2)}s"


def _routing_filter(*, renders: bool, hold: str = "60s") -> dict[str, Any]:
    """One stream per request: headers, the buffered body (the reply routes and rewrites it),
    the response headers and — switched on per request — a JSON answer's buffered body.
    ``renders``: the virtual host adds the diagnostic headers from the ``saar`` metadata (a
    whole bootstrap does; a fragment leaves the routes to their owner), and the filter says so
    to the processor."""
    grpc_service: dict[str, Any] = {"envoy_grpc": {"cluster_name": PROCESSOR}, "timeout": "5s"}
    if renders:
        grpc_service["initial_metadata"] = [{"key": RENDERS_KEY, "value": "1"}]
    return {
        "name": ROUTING_FILTER,
        "typed_config": {
            "@type": EXT_PROC,
            "stat_prefix": "saar",
            "grpc_service": grpc_service,
            # Fail closed: a request that bypassed the processor would keep spoofed headers.
            "failure_mode_allow": False,
            "message_timeout": "1s",
            "max_message_timeout": hold,
            "allow_mode_override": True,
            # Which worker Envoy really used, sent with the response headers.
            "response_attributes": [UPSTREAM_ATTRIBUTE],
            "processing_mode": {
                "request_header_mode": "SEND",
                "request_body_mode": "BUFFERED",
                "response_header_mode": "SEND",
                "response_body_mode": "NONE",
                "request_trailer_mode": "SKIP",
                "response_trailer_mode": "SKIP",
            },
            "metadata_options": {
                "receiving_namespaces": {"untyped": [METADATA_NAMESPACE, LB_NAMESPACE]},
                # The proxy's subset hint reaches the processor as filter metadata.
                "forwarding_namespaces": {"untyped": [SUBSET_NAMESPACE]},
            },
        },
    }


def _observe_filter() -> dict[str, Any]:
    """Non-blocking, and on only for streamed (SSE) answers (by route): the chunks stream past
    the processor, which learns ids and usage without holding any of them."""
    return {
        "name": OBSERVE_FILTER,
        "typed_config": {
            "@type": EXT_PROC,
            "stat_prefix": "saar_observe",
            "grpc_service": {
                "envoy_grpc": {"cluster_name": OBSERVER},
                "timeout": "5s",
            },
            "observability_mode": True,
            # The processor ends the stream once the response is understood; this bounds
            # how long Envoy keeps one open if it does not.
            "deferred_close_timeout": "1s",
            "failure_mode_allow": True,
            "processing_mode": {
                "request_header_mode": "SKIP",
                "request_body_mode": "NONE",
                "response_header_mode": "SKIP",
                "response_body_mode": "STREAMED",
                "request_trailer_mode": "SKIP",
                "response_trailer_mode": "SKIP",
            },
            # The turn to complete travels here, so any replica can complete it.
            "metadata_options": {"forwarding_namespaces": {"untyped": [METADATA_NAMESPACE]}},
        },
    }


def _router_filter() -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        },
    }


def _add_header(name: str, value: str) -> dict[str, Any]:
    return {"header": {"key": name, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}


def _access_log(path: str) -> dict[str, Any]:
    return {
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": path,
            "log_format": {
                "json_format": {
                    "path": "%REQ(:PATH)%",
                    "status": "%RESPONSE_CODE%",
                    "cluster": "%UPSTREAM_CLUSTER%",
                    "upstream": "%UPSTREAM_HOST%",
                    "replay_id": f"%DYNAMIC_METADATA({METADATA_NAMESPACE}:replay_id)%",
                    "duration_ms": "%DURATION%",
                }
            },
        },
    }


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _endpoints(name: str, endpoints: tuple[str, ...]) -> dict[str, Any]:
    lb = []
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        lb.append({"endpoint": {"address": _address(_unbracketed(host), int(port))}})
    return {"cluster_name": name, "endpoints": [{"lb_endpoints": lb}]}


def _discovery(endpoints: tuple[str, ...]) -> str:
    for endpoint in endpoints:
        try:
            ipaddress.ip_address(_unbracketed(endpoint.rpartition(":")[0]))
        except ValueError:
            return "STRICT_DNS"
    return "STATIC"


def _processor_cluster(name: str, ports: EnvoyPorts,
                       tls: ProcessorTls | None) -> dict[str, Any]:
    """The processor, once per filter: observation (fail open) must never use up the streams
    of routing (fail closed). One stream per HTTP request, so the default limit of 1,024
    concurrent requests would cap the proxy; it is lifted. Replicas are balanced round robin;
    one that stops answering is ejected at its first failed connection and found by the gRPC
    health check (``readiness``, which a draining replica turns off first). The check runs
    every half second from the start: Envoy's default for a cluster that has carried no
    traffic yet is once a minute, and the timer set then outlives the first requests, so a
    replica draining in a fresh Envoy's first minute went on getting new streams."""
    endpoints = ports.processors
    limit = 1_000_000
    cluster: dict[str, Any] = {
        "name": name,
        "type": _discovery(endpoints),
        "connect_timeout": "1s",
        "circuit_breakers": {
            "thresholds": [
                {"max_connections": limit, "max_pending_requests": limit,
                 "max_requests": limit, "max_retries": 3}
            ]
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "health_checks": [
            {
                "timeout": "0.5s",
                "interval": "0.5s",
                # Before the cluster's first request: Envoy's default is a minute (a draining
                # replica hid for a fresh Envoy's first minute); every 0.5 s cost an idle
                # processor more than its paced scrapes (issue 31's 5 ms of CPU a second), and
                # every 5 s still half of that budget.
                "no_traffic_interval": "15s",
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "grpc_health_check": {"service_name": "readiness"},
            }
        ],
        "outlier_detection": {
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 1,
            "interval": "1s",
            "base_ejection_time": "2s",
            "max_ejection_percent": 100,
        },
        "load_assignment": _endpoints(name, endpoints),
    }
    if tls is not None:
        server_name = tls.server_name or _unbracketed(endpoints[0].rpartition(":")[0])
        cluster["transport_socket"] = _tls_socket(tls.ca_file, server_name)
        if tls.client_cert_file is not None and tls.client_key_file is not None:
            context = cluster["transport_socket"]["typed_config"]["common_tls_context"]
            context["tls_certificates"] = [{
                "certificate_chain": {"filename": tls.client_cert_file},
                "private_key": {"filename": tls.client_key_file}}]
    return cluster


def _tls_socket(ca_file: str | None, server_name: str | None = None, *,
                alpn: bool = True) -> dict[str, Any]:
    """TLS to a gRPC server: ALPN h2 (as gRPC asks); the certificate checked against
    ``ca_file`` (for ``server_name``) when given, else encrypted only (an empty validation
    context)."""
    context: dict[str, Any] = {"validation_context": {}}
    if alpn:
        context["alpn_protocols"] = ["h2"]
    socket: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
                 "UpstreamTlsContext",
        "common_tls_context": context,
    }
    if ca_file is not None:
        context["validation_context"] = {"trusted_ca": {"filename": ca_file}}
        if server_name:
            kind = "DNS"
            try:
                ipaddress.ip_address(server_name)
                kind = "IP_ADDRESS"
            except ValueError:
                socket["sni"] = server_name
            context["validation_context"]["match_typed_subject_alt_names"] = [
                {"san_type": kind, "matcher": {"exact": server_name}}]
    return {"name": "envoy.transport_sockets.tls", "typed_config": socket}


def _host(host: str) -> str:
    """A host as it goes before ``:port`` (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _unbracketed(host: str) -> str:
    return host[1:-1] if host.startswith("[") else host


def _model_cluster(name: str, endpoints: tuple[str, ...]) -> dict[str, Any]:
    return {
        "name": name,
        "type": _discovery(endpoints),
        "connect_timeout": "1s",
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT,
        # Retries in flight at once: a quarter of the requests in flight, at least 8 (the
        # default of 3 would fail the rest of a burst's retries at once).
        "circuit_breakers": {"thresholds": [{"retry_budget": {
            "budget_percent": {"value": 25.0}, "min_retry_concurrency": 8}}]},
        "load_assignment": _endpoints(name, endpoints),
        "load_balancing_policy": _override_host_policy(),
    }


def _override_host_policy() -> dict[str, Any]:
    """Go to the worker the processor picked (metadata list first: primary then fallbacks, else
    the header); without a pick, or when the picked hosts are gone, Envoy balances as usual."""
    return {
        "policies": [
            {
                "typed_extension_config": {
                    "name": "envoy.load_balancing_policies.override_host",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies."
                        "override_host.v3.OverrideHost",
                        "override_host_sources": [
                            {"metadata": {"key": LB_NAMESPACE,
                                          "path": [{"key": DESTINATION_HEADER}]}},
                            {"header": DESTINATION_HEADER},
                        ],
                        "fallback_policy": {
                            "policies": [
                                {
                                    "typed_extension_config": {
                                        "name": "envoy.load_balancing_policies.round_robin",
                                        "typed_config": {
                                            "@type": "type.googleapis.com/envoy.extensions."
                                            "load_balancing_policies.round_robin.v3.RoundRobin"
                                        },
                                    }
                                }
                            ]
                        },
                    },
                }
            }
        ]
    }


# -- the shape gateways generate for an InferencePool ---------------------------------------

EPP_FILTER = "envoy.filters.http.ext_proc.epp"
MODEL_ROUTER_FILTER = "saar-model-router"
PROCESSING_SERVER = "ext-proc-model-router"


@dataclass(frozen=True)
class GatewayPool:
    """One InferencePool as a gateway renders it: its ORIGINAL_DST cluster, its picker."""

    model: str
    picker_port: int
    fail_open: bool = False
    """The InferencePool's ``endpointPickerRef.failureMode: FailOpen``."""
    more_picker_ports: tuple[int, ...] = ()
    """The picker's other replicas. Several are health-checked (gRPC health of the ext_proc
    service, as the Endpoint Picker Protocol names it): the ready ones are what the picker
    Service's endpoints would list, so a draining replica gets no new stream."""


def gateway_bootstrap(
    pools: tuple[GatewayPool, ...],
    *,
    listen: int,
    admin: int,
    model_header: str,
    router_port: int | None = None,
    host: str = "127.0.0.1",
    tls: bool = True,
    access_log: str | None = None,
) -> dict[str, Any]:
    """Envoy in the shape Envoy AI Gateway generates for InferencePool backends, emulated:
    the picker's ext_proc over TLS with an empty validation context (encrypted, unverified),
    request and response bodies ``FULL_DUPLEX_STREAMED``, trailers SEND, a 300 s message
    timeout, fail closed unless the pool says FailOpen; each pool's route goes to an
    ``ORIGINAL_DST`` cluster that takes the host from ``x-gateway-destination-endpoint``.

    With ``router_port`` the model router sits in front as a gateway attaches it (Envoy
    Gateway's EnvoyExtensionPolicy): buffered request body, response headers, mode override,
    fail closed. The HTTPRoute matches ``model_header``, one rule per pool; the picker filter
    follows the route (per-route override of its gRPC service), as a gateway wires one picker
    per InferencePool."""
    routes: list[dict[str, Any]] = []
    for pool in pools:
        match: dict[str, Any] = {"prefix": "/"}
        if router_port is not None:
            match["headers"] = [{"name": model_header,
                                 "string_match": {"exact": pool.model}}]
        routes.append({
            "name": f"pool-{pool.model}",
            "match": match,
            "route": {"cluster": f"pool-{pool.model}", "timeout": "0s"},
            "typed_per_filter_config": {EPP_FILTER: {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3."
                         "ExtProcPerRoute",
                "overrides": {"grpc_service": {
                    "envoy_grpc": {"cluster_name": f"epp-{pool.model}"}, "timeout": "300s"},
                    "failure_mode_allow": pool.fail_open},
            }},
        })
    if router_port is not None:
        routes.append({"name": "no-model", "match": {"prefix": "/"},
                       "direct_response": {"status": 404, "body": {
                           "inline_string": "no InferencePool for this model\n"}}})
    filters = []
    if router_port is not None:
        filters.append(_gateway_router_filter())
    filters.append(_epp_filter(pools[0]))
    filters.append(_router_filter())
    hcm: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "codec_type": "AUTO",
        "route_config": {"name": "httproute", "virtual_hosts": [{
            "name": "gateway", "domains": ["*"],
            # Which worker served: Envoy's own word, for the tests and the curious.
            "response_headers_to_add": [_add_header(WORKER_HEADER, "%UPSTREAM_REMOTE_ADDRESS%")],
            "routes": routes,
        }]},
        "http_filters": filters,
    }
    if access_log:
        hcm["access_log"] = [_access_log(access_log)]
    clusters = [_picker_cluster(f"epp-{p.model}", host, (p.picker_port, *p.more_picker_ports),
                                tls) for p in pools]
    clusters += [_original_dst_cluster(f"pool-{p.model}") for p in pools]
    if router_port is not None:
        clusters.append(_picker_cluster(PROCESSING_SERVER, host, (router_port,), tls))
    return {
        "admin": {"address": _address("127.0.0.1", admin)},
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": _address("127.0.0.1", listen),
                "per_connection_buffer_limit_bytes": BUFFER_LIMIT,
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm}]}],
            }],
            "clusters": clusters,
        },
    }


def _epp_filter(default: GatewayPool) -> dict[str, Any]:
    return {
        "name": EPP_FILTER,
        "typed_config": {
            "@type": EXT_PROC,
            "grpc_service": {"envoy_grpc": {"cluster_name": f"epp-{default.model}"},
                             "timeout": "300s"},
            "failure_mode_allow": default.fail_open,
            "message_timeout": "300s",
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND",
                "request_body_mode": "FULL_DUPLEX_STREAMED",
                "response_body_mode": "FULL_DUPLEX_STREAMED",
                "request_trailer_mode": "SEND",
                "response_trailer_mode": "SEND",
            },
        },
    }


def _gateway_router_filter() -> dict[str, Any]:
    return {
        "name": MODEL_ROUTER_FILTER,
        "typed_config": {
            "@type": EXT_PROC,
            "grpc_service": {"envoy_grpc": {"cluster_name": PROCESSING_SERVER},
                             "timeout": "10s"},
            "failure_mode_allow": False,
            "message_timeout": "10s",
            "allow_mode_override": True,
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND",
                "request_body_mode": "BUFFERED",
                "response_body_mode": "NONE",
            },
        },
    }


def _picker_cluster(name: str, host: str, ports: tuple[int, ...], tls: bool) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STRICT_DNS",
        "lb_policy": "LEAST_REQUEST",
        "connect_timeout": "10s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": _endpoints(name, tuple(f"{host}:{port}" for port in ports)),
    }
    if len(ports) > 1:
        cluster["health_checks"] = [{
            "timeout": "0.5s", "interval": "0.5s", "no_traffic_interval": "0.5s",
            "unhealthy_threshold": 1, "healthy_threshold": 1,
            "grpc_health_check": {"service_name": EXT_PROC_SERVICE}}]
    if tls:
        # As Envoy AI Gateway generates it: no ALPN, not verified. (Envoy's gRPC health check
        # of several replicas reaches them only with ALPN h2.)
        cluster["transport_socket"] = _tls_socket(None, alpn=len(ports) > 1)
    return cluster


def _original_dst_cluster(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "10s",
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT,
        "original_dst_lb_config": {"use_http_header": True,
                                   "http_header_name": DESTINATION_HEADER},
    }
