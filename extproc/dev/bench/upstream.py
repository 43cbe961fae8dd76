"""The cheapest upstream we can put behind the proxy: a second Envoy answering every request with
a canned chat completion — streamed as SSE when the request carries ``x-bench-stream`` — so the
proxy path, not the model server, dominates the measurement.

It buffers the whole request before answering: an HTTP/1.1 answer sent before the body ends
would make the proxy close its upstream connection and reconnect on every request.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import yaml

from ..harness import envoy_binary, free_port, wait_http

MAX_REQUEST_BYTES = 32 * 1024 * 1024
COMPLETION = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 0,
    "model": "qwen3-8b",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 512, "completion_tokens": 1, "total_tokens": 513},
}
STREAM_HEADER = "x-bench-stream"
CHUNK = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0,
         "model": "qwen3-8b",
         "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]}
LAST = {**CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": COMPLETION["usage"]}
EVENTS = "".join(f"data: {orjson.dumps(e).decode()}\n\n" for e in (CHUNK, CHUNK, LAST))
EVENTS += "data: [DONE]\n\n"


def _canned(body: str, content_type: str, match: dict[str, Any]) -> dict[str, Any]:
    return {
        "match": match,
        "direct_response": {"status": 200, "body": {"inline_string": body}},
        "response_headers_to_add": [{
            "header": {"key": "content-type", "value": content_type},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }],
    }


def bootstrap(listen: int, admin: int) -> dict[str, Any]:
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "upstream",
        "codec_type": "AUTO",
        "route_config": {
            "virtual_hosts": [{
                "name": "canned",
                "domains": ["*"],
                "routes": [
                    _canned(EVENTS, "text/event-stream", {
                        "prefix": "/",
                        "headers": [{"name": STREAM_HEADER, "present_match": True}]}),
                    _canned(orjson.dumps(COMPLETION).decode(), "application/json",
                            {"prefix": "/"}),
                ],
            }],
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.buffer",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                    "max_request_bytes": MAX_REQUEST_BYTES,
                },
            },
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    return {
        "admin": {"address": _address(admin)},
        "static_resources": {
            "listeners": [{
                "name": "canned",
                "address": _address(listen),
                "per_connection_buffer_limit_bytes": MAX_REQUEST_BYTES,
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm,
                }]}],
            }],
        },
    }


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


@contextlib.contextmanager
def canned_upstream(workdir: Path) -> Iterator[str]:
    """Run the canned upstream; yields its ``host:port``."""
    listen, admin = free_port(), free_port()
    config = workdir / "upstream.yaml"
    config.write_text(yaml.safe_dump(bootstrap(listen, admin), sort_keys=False))
    with (workdir / "upstream.log").open("wb") as log:
        proc = subprocess.Popen(
            [envoy_binary(), "-c", str(config), "--log-level", "warn", "--concurrency", "1",
             "--use-dynamic-base-id"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            wait_http(f"http://127.0.0.1:{admin}/ready", proc)
            yield f"127.0.0.1:{listen}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
