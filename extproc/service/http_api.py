"""The processor's HTTP port: Prometheus ``/metrics``, ``/healthz`` and ``/readyz`` (open), and
the admin surfaces behind ``AdminAuth``: the replay API, session lists and timelines, and the
web view.

    GET  /healthz                         200 while the process serves (liveness)
    GET  /readyz                          200 while it takes new streams, 503 while it starts
                                          (before its workers and store are there) or drains
    GET  /v1/replay/{id}                  one record
    GET  /v1/replay?session_id=S[&tenant=T]   a session's records (T: the admin's choice)
    GET  /v1/sessions[?limit=N]           recent sessions, summarised: every replica's with a
                                          shared store, else this replica's
    GET  /v1/timeline?session_id=S[&tenant=T]  Chrome trace-event JSON of the session and
                                          its sub-agents
    GET  /v1/workers                      the router's view of every worker (admin only): the
                                          load it scraped, what it routed there, the KV blocks
                                          the precise index holds for it
    GET  /ui[#rp-...]                     the web view (a sign-in form until signed in); a replay
                                          id after ``#`` opens that decision
    POST /ui/login, /ui/logout            set or clear the web view's cookie
"""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from importlib import resources

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..assembly import Parts
from ..observability.sessions import summarize
from ..observability.timeline import timeline
from .admin import COOKIE, COOKIE_SECONDS, Caller, Denied
from .readiness import Readiness
from .telemetry import Telemetry

PARTS_KEY = web.AppKey("parts", Parts)
TELEMETRY_KEY = web.AppKey("telemetry", Telemetry)
READINESS_KEY = web.AppKey("readiness", Readiness)
MAX_SESSIONS_LISTED = 500
_UI = resources.files(__package__) / "ui"
_NOT_FOUND = {"error": "unknown replay id"}

AdminHandler = Callable[[web.Request, Caller], Awaitable[web.StreamResponse]]


async def _metrics(request: web.Request) -> web.Response:
    request.app[TELEMETRY_KEY].figures.sweep()
    return web.Response(
        body=generate_latest(request.app[PARTS_KEY].metrics.registry),
        headers={"Content-Type": CONTENT_TYPE_LATEST},
    )


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    readiness = request.app[READINESS_KEY]
    return web.json_response({"status": readiness.state},
                             status=200 if readiness.serving else 503)


async def _replay_one(request: web.Request, caller: Caller) -> web.Response:
    record = await request.app[TELEMETRY_KEY].lookup.get(request.match_info["replay_id"])
    if record is None or not caller.sees(record):
        return web.json_response(_NOT_FOUND, status=404)
    return web.json_response(record)


async def _session_records(
    request: web.Request, caller: Caller
) -> tuple[str, list[dict]] | web.Response:
    session_id = request.query.get("session_id")
    if not session_id:
        return web.json_response({"error": "session_id query parameter is required"}, status=400)
    tenant = caller.scope(request.query.get("tenant"))
    return session_id, await request.app[TELEMETRY_KEY].lookup.for_session(session_id, tenant)


async def _replay_session(request: web.Request, caller: Caller) -> web.Response:
    found = await _session_records(request, caller)
    if isinstance(found, web.Response):
        return found
    session_id, records = found
    return web.json_response({"session_id": session_id, "records": records})


async def _sessions(request: web.Request, caller: Caller) -> web.Response:
    try:
        limit = min(MAX_SESSIONS_LISTED, max(1, int(request.query.get("limit", "50"))))
    except ValueError:
        return web.json_response({"error": "limit must be an integer"}, status=400)
    models = request.app[PARTS_KEY].config.models
    found = await request.app[TELEMETRY_KEY].lookup.sessions(caller.tenant, limit)
    return web.json_response({"sessions": [summarize(records, models) for records in found]})


async def _timeline(request: web.Request, caller: Caller) -> web.Response:
    found = await _session_records(request, caller)
    if isinstance(found, web.Response):
        return found
    session_id, records = found
    store = request.app[PARTS_KEY].replay
    for tenant in {(r.get("session") or {}).get("tenant") for r in records}:
        for child in store.sub_sessions(str(tenant), session_id):
            records += store.for_session(child[1], child[0])
    return web.json_response(timeline(records))


async def _workers(request: web.Request, caller: Caller) -> web.Response:
    if not caller.admin:
        return web.json_response({"error": "the worker view is the admin's"}, status=403)
    return web.json_response({"workers": request.app[PARTS_KEY].pools.view()})


async def _ui(request: web.Request, caller: Caller) -> web.Response:
    who = "admin: every tenant" if caller.admin else f"tenant {caller.tenant}"
    page = (_UI / "index.html").read_text().replace("{{who}}", html.escape(who))
    return web.Response(text=page, content_type="text/html", headers={"Cache-Control": "no-store"})


def _sign_in_page(message: str, status: int) -> web.Response:
    page = (_UI / "login.html").read_text().replace("{{message}}", html.escape(message))
    return web.Response(text=page, content_type="text/html", status=status)


async def _login(request: web.Request) -> web.Response:
    telemetry = request.app[TELEMETRY_KEY]
    form = await request.post()
    token = str(form.get("token", "")).strip()
    try:
        caller = telemetry.auth.caller({"authorization": f"Bearer {token}"} if token else {})
    except Denied as denied:
        return _sign_in_page(denied.message, denied.status)
    response = web.Response(status=303, headers={"Location": "/ui"})
    response.set_cookie(COOKIE, telemetry.auth.cookie(caller), max_age=COOKIE_SECONDS,
                        httponly=True, samesite="Strict", path="/", secure=request.secure)
    return response


async def _logout(request: web.Request) -> web.Response:
    response = web.Response(status=303, headers={"Location": "/ui"})
    response.del_cookie(COOKIE, path="/")
    return response


def _admin(
    handler: AdminHandler, *, page: bool = False
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """``handler`` behind the credential: a JSON 401/403 for the API, the sign-in form (or the
    how-to-configure page) for the web view."""

    async def checked(request: web.Request) -> web.StreamResponse:
        auth = request.app[TELEMETRY_KEY].auth
        try:
            caller = auth.caller(
                {k.lower(): v for k, v in request.headers.items()}, request.cookies.get(COOKIE)
            )
        except Denied as denied:
            if page:
                return _sign_in_page(denied.message, denied.status)
            headers = {"WWW-Authenticate": "Bearer"} if denied.status == 401 else {}
            return web.json_response({"error": denied.message}, status=denied.status,
                                     headers=headers)
        return await handler(request, caller)

    return checked


def build_http_app(parts: Parts, telemetry: Telemetry, readiness: Readiness) -> web.Application:
    app = web.Application()
    app[PARTS_KEY] = parts
    app[TELEMETRY_KEY] = telemetry
    app[READINESS_KEY] = readiness
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/v1/replay", _admin(_replay_session))
    app.router.add_get("/v1/replay/{replay_id}", _admin(_replay_one))
    app.router.add_get("/v1/sessions", _admin(_sessions))
    app.router.add_get("/v1/timeline", _admin(_timeline))
    app.router.add_get("/v1/workers", _admin(_workers))
    app.router.add_get("/ui", _admin(_ui, page=True))
    app.router.add_post("/ui/login", _login)
    app.router.add_post("/ui/logout", _logout)
    return app
