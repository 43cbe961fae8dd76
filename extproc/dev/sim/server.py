"""HTTP wiring of a simulated vLLM server: the API routes, operations endpoints and the CLI.

Endpoints: ``POST /v1/chat/completions``, ``/v1/responses``, ``/v1/messages``,
``/v1/completions``; ``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel`` (a
stored response, on the instance that answered it); ``GET /v1/models``, ``/metrics``,
``/health``; ``POST /v1/kv/hints`` (the router's KV hints); ``POST /admin/faults``, ``GET
/admin/state``, ``POST /admin/reset``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from ...scheduling.kv_hints import HINTS_PATH, decode_hints
from ...types import API_PATHS
from .config import SimConfig, add_arguments
from .simulator import Simulator, openai_error

__all__ = ["SIMULATOR", "SimConfig", "Simulator", "add_arguments", "build_app", "run"]

SIMULATOR = web.AppKey("simulator", Simulator)


def build_app(cfg: SimConfig) -> web.Application:
    """A fresh application with its own state and metrics registry."""
    sim = Simulator(cfg)
    app = web.Application(client_max_size=cfg.max_body_bytes + 1)
    app[SIMULATOR] = sim
    for path in API_PATHS:
        app.router.add_post(path, sim.handle_api)
    app.router.add_get("/v1/responses/{response_id}", _stored_response)
    app.router.add_post("/v1/responses/{response_id}/cancel", _cancel_response)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health", _health)
    app.router.add_post(HINTS_PATH, _hints)
    app.router.add_post("/admin/faults", _faults)
    app.router.add_get("/admin/state", _state)
    app.router.add_post("/admin/reset", _reset)
    app.on_response_prepare.append(_tag_response)
    app.on_cleanup.append(_close)
    return app


async def _close(app: web.Application) -> None:
    await app[SIMULATOR].close()


def run(args: argparse.Namespace) -> None:
    """Serve until interrupted (the ``saar sim-server`` command)."""
    cfg = SimConfig.from_args(args)
    print(f"sim-server {cfg.instance_id}: {cfg.model} on http://{cfg.host}:{cfg.port}", flush=True)
    web.run_app(build_app(cfg), host=cfg.host, port=cfg.port, print=None, access_log=None)


async def _tag_response(request: web.Request, response: web.StreamResponse) -> None:
    """Every response names the instance, so tests and benchmarks see where routing went."""
    cfg = request.app[SIMULATOR].cfg
    response.headers["x-sim-instance"] = cfg.instance_id
    response.headers["x-sim-model"] = cfg.model
    response.headers["x-sim-role"] = cfg.role


async def _models(request: web.Request) -> web.Response:
    cfg = request.app[SIMULATOR].cfg
    created = int(time.time())
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": cfg.model,
            "parent": None,
            "max_model_len": cfg.max_model_len,
        }
        for name in cfg.served_names
    ]
    return _json({"object": "list", "data": data})


async def _stored_response(request: web.Request) -> web.Response:
    """vLLM's retrieve: the stored response, or 404 on any instance that did not answer it."""
    response_id = request.match_info["response_id"]
    stored = request.app[SIMULATOR].stored(response_id)
    if stored is None:
        return _not_stored(response_id)
    return _json(stored)


async def _cancel_response(request: web.Request) -> web.Response:
    """vLLM's cancel: only a background response can be; the simulator answers none so."""
    response_id = request.match_info["response_id"]
    if request.app[SIMULATOR].stored(response_id) is None:
        return _not_stored(response_id)
    return openai_error(400, "Cannot cancel a synchronous response.",
                        kind="invalid_request_error", code=400)


def _not_stored(response_id: str) -> web.Response:
    return openai_error(404, f"Response with id '{response_id}' not found.",
                        kind="invalid_request_error", code=404)


async def _metrics(request: web.Request) -> web.Response:
    sim = request.app[SIMULATOR]
    sim.scrapes += 1
    body = sim.metrics.render()
    return web.Response(body=body, headers={"content-type": CONTENT_TYPE_LATEST})


async def _health(request: web.Request) -> web.Response:
    return web.Response()


async def _hints(request: web.Request) -> web.Response:
    """A batch of KV hints: ``{"applied": n, "ignored": m}``; a malformed batch is a 400."""
    sim = request.app[SIMULATOR]
    try:
        hints = decode_hints(await request.read(), f"{sim.cfg.host}:{sim.cfg.port}")
    except ValueError as exc:
        return openai_error(400, f"bad hints: {exc}", kind="invalid_request_error")
    applied = sum(sim.hint(h) for h in hints)
    return _json({"applied": applied, "ignored": len(hints) - applied})


async def _faults(request: web.Request) -> web.Response:
    """``{"fail_next": k}`` fails the next k API requests; ``{"fail_every": n}`` re-plans."""
    sim = request.app[SIMULATOR]
    try:
        plan = orjson.loads(await request.read())
        sim.plan_faults(
            fail_next=_optional_int(plan.get("fail_next")),
            fail_every=_optional_int(plan.get("fail_every")),
        )
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        return openai_error(400, f"bad fault plan: {exc}", kind="invalid_request_error")
    return _json(sim.state()["faults"])


async def _state(request: web.Request) -> web.Response:
    return _json(request.app[SIMULATOR].state())


async def _reset(request: web.Request) -> web.Response:
    sim = request.app[SIMULATOR]
    sim.reset()
    return _json(sim.state())


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _json(doc: dict[str, Any]) -> web.Response:
    return web.Response(body=orjson.dumps(doc), content_type="application/json")
