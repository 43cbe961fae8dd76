"""The processor's HTTP port: Prometheus ``/metrics``, ``/healthz`` and the replay lookup API."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..core.router import Router

ROUTER_KEY = web.AppKey("router", Router)


async def _metrics(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    return web.Response(
        body=generate_latest(router.metrics.registry),
        headers={"Content-Type": CONTENT_TYPE_LATEST},
    )


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _replay_one(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    record = router.replay.get(request.match_info["replay_id"])
    if record is None:
        return web.json_response({"error": "unknown replay id"}, status=404)
    return web.json_response(record)


async def _replay_session(request: web.Request) -> web.Response:
    session_id = request.query.get("session_id")
    if not session_id:
        return web.json_response({"error": "session_id query parameter is required"}, status=400)
    records = request.app[ROUTER_KEY].replay.for_session(session_id)
    return web.json_response({"session_id": session_id, "records": records})


def build_http_app(router: Router) -> web.Application:
    app = web.Application()
    app[ROUTER_KEY] = router
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/v1/replay", _replay_session)
    app.router.add_get("/v1/replay/{replay_id}", _replay_one)
    return app
