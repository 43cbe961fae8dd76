"""The Envoy configs compared, each derived from ``envoy_config.bootstrap`` so that the only
difference between variants is the ext_proc filters in front of the router."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from ...adapter.contract import OBSERVER, PROCESSOR
from .passthrough import BUSY_PREFIX

Bootstrap = dict[str, Any]
VARIANTS = ("envoy", "passthrough", "saar")


def _http_filters(doc: Bootstrap) -> list[dict[str, Any]]:
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    filters: list[dict[str, Any]] = hcm["typed_config"]["http_filters"]
    return filters


def envoy_only(doc: Bootstrap) -> Bootstrap:
    """No ext_proc filter: the router alone."""
    filters = _http_filters(doc)
    filters[:] = [f for f in filters if f["name"] == "envoy.filters.http.router"]
    return doc


def passthrough(doc: Bootstrap) -> Bootstrap:
    """One blocking filter (headers, buffered body, response headers) instead of saar's two."""
    filters = _http_filters(doc)
    single = copy.deepcopy(filters[0])
    config = single["typed_config"]
    single["name"] = config["stat_prefix"] = "passthrough"
    config["processing_mode"]["response_header_mode"] = "SEND"
    config.pop("metadata_options", None)
    filters[:] = [single, filters[-1]]
    return doc


def saar(doc: Bootstrap) -> Bootstrap:
    """The real config, unchanged."""
    return doc


def saar_route_only(doc: Bootstrap) -> Bootstrap:
    """Only the routing filter, nothing observed: what the response side costs, by difference."""
    filters = _http_filters(doc)
    filters[0]["typed_config"]["processing_mode"]["response_header_mode"] = "SKIP"
    filters[:] = [filters[0], filters[-1]]
    return doc


def saar_two_streams(doc: Bootstrap) -> Bootstrap:
    """The design measured against: every response observed on a second, non-blocking stream
    (observe filter on every route, sent the headers) instead of on the routing stream."""
    filters = _http_filters(doc)
    filters[0]["typed_config"]["processing_mode"]["response_header_mode"] = "SKIP"
    filters[1]["typed_config"]["processing_mode"]["response_header_mode"] = "SEND"
    for route in doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["route_config"]["virtual_hosts"][0]["routes"]:
        route.pop("typed_per_filter_config", None)
    return doc


TRANSFORMS: dict[str, Callable[[Bootstrap], Bootstrap]] = {
    "envoy": envoy_only,
    "passthrough": passthrough,
    "saar": saar,
    "saar-redis": saar,
    "saar-two-streams": saar_two_streams,
    "saar-route-only": saar_route_only,
}


def transform(variant: str) -> Callable[[Bootstrap], Bootstrap]:
    """The Envoy config of ``variant``: one of ``TRANSFORMS``, or ``busy-<N>`` (the
    pass-through's, its processor spending N microseconds on each request body)."""
    if variant.startswith(BUSY_PREFIX):
        try:
            float(variant.removeprefix(BUSY_PREFIX))
        except ValueError:
            pass
        else:
            return passthrough
    if variant not in TRANSFORMS:
        raise ValueError(f"unknown variant {variant!r}; known: {sorted(TRANSFORMS)} and "
                         f"{BUSY_PREFIX}<microseconds>")
    return TRANSFORMS[variant]


STORES = {"saar-redis": "redis"}
"""Variants whose processor keeps its state in a store server the bench starts (Envoy's config
is saar's own): the state layer's cost, measured beside the in-process store."""


def pointed_at(upstream: str | None, transform: Callable[[Bootstrap], Bootstrap]) -> Callable[
    [Bootstrap], Bootstrap
]:
    """``transform``, then every model cluster sent to ``upstream`` (``host:port``) if given."""

    def apply(doc: Bootstrap) -> Bootstrap:
        doc = transform(doc)
        if upstream is None:
            return doc
        host, _, port = upstream.rpartition(":")
        address = {"socket_address": {"address": host, "port_value": int(port)}}
        for cluster in doc["static_resources"]["clusters"]:
            if cluster["name"] not in (PROCESSOR, OBSERVER):
                cluster["type"] = "STATIC"
                cluster["load_assignment"]["endpoints"] = [
                    {"lb_endpoints": [{"endpoint": {"address": address}}]}
                ]
        return doc

    return apply
