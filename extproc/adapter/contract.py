"""Every name Envoy and the processor agree on, in one place: the adapter speaks them and the
bootstrap renderer writes them into Envoy's config, so the two cannot drift apart.

Headers the processor sets are ones Envoy trusts for routing; the client's copies are always
removed first (``Router.spoofed``).
"""

from __future__ import annotations

# -- headers -------------------------------------------------------------------------------

DESTINATION_HEADER = "x-gateway-destination-endpoint"
"""The picked worker(s), ``ip:port[,ip:port…]`` (the Endpoint Picker Protocol's name)."""
SERVED_KEY = "x-gateway-destination-endpoint-served"
"""What Envoy reports it really used, in ``envoy.lb`` metadata on the response path."""
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
"""The proxy's subset hint, in ``envoy.lb.subset_hint`` filter metadata."""
PREFILL_HEADER = "x-prefiller-host-port"
"""The prefill worker (``host:port``) of a split request, for the decode worker's routing
sidecar, which calls it first (llm-d's name; absent: the decode worker prefills itself)."""
OBSERVE_HEADER = "x-saar-observe"
"""Marks a streamed request: only the route matching it enables the observe filter."""
WORKER_HEADER = "x-saar-worker"
"""Response header: the worker that served (``%UPSTREAM_REMOTE_ADDRESS%``)."""
PICK_HEADER = "x-saar-endpoint"
"""Response header the processor sets itself: the endpoint it picked (its first choice)."""
PREFILL_PICK_HEADER = "x-saar-prefill-endpoint"
"""Response header the processor sets itself: the prefill worker it picked, when it split."""
MODEL_HEADER = "x-gateway-model-name"
"""The default ``routing.model_header``: the routed model, which HTTPRoute rules match."""
CLUSTER_HEADER = "x-saar-cluster"
"""The default ``routing.cluster_header``: the cluster Envoy's route sends the request to."""
DIAGNOSTIC_PREFIX = "x-saar-"
REPLAY_HEADER = "x-replay-id"
"""The decision's record, on every answer (errors the processor gives included)."""
DROP_REASON_HEADER = "x-saar-drop-reason"
"""Why flow control shed the request (``scheduling.flow.REASONS``), on its 429."""

DIAGNOSTIC_HEADERS = {
    REPLAY_HEADER: "replay_id",
    "x-saar-selected-model": "selected_model",
    "x-saar-decision": "decision",
    "x-saar-session-phase": "session_phase",
    "x-saar-action": "action",
    "x-saar-confidence": "confidence",
    "x-saar-context-tokens": "context_tokens",
}
"""Response header → the ``saar`` metadata key Envoy renders it from."""
RENDERS_KEY = "x-saar-renders-diagnostics"
"""gRPC metadata the routing filter of a config we render sends on each stream: that Envoy adds
the diagnostic headers from the ``saar`` metadata itself, so the processor does not send them
again with the response headers (a gateway's or an existing Envoy's filter does not say it)."""

# -- metadata namespaces and keys ----------------------------------------------------------

METADATA_NAMESPACE = "saar"
"""Dynamic metadata the processor emits: the diagnostics, and what the observe stream needs to
complete the turn on any replica (Envoy forwards it to the observe filter)."""
TURN_KEY = "turn"
API_KEY = "api"
ERROR_KEY = "error"
"""Set (to the error's code) with every immediate response the processor sends: Envoy's local
reply mappers leave those bodies alone and rewrite only the errors Envoy makes itself."""
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"

# -- attributes ----------------------------------------------------------------------------

ATTRIBUTES_NAMESPACE = "envoy.filters.http.ext_proc"
UPSTREAM_ATTRIBUTE = "upstream.address"

# -- filters and clusters ------------------------------------------------------------------

MODEL_RETRIES = 3
"""Envoy's retries of a model request (connect failure, reset, 502/503/529) before the answer
starts; a request a hard lock pins to its issuer lists that worker once per attempt."""

ROUTING_FILTER = "saar"
OBSERVE_FILTER = "saar-observe"
PROCESSOR = "saar_extproc"
OBSERVER = "saar_extproc_observe"
