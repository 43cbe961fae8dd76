"""Issue 9 item 11: the admin surfaces need a credential, ids are unguessable, lookups are
scoped by tenant — over HTTP, over gRPC, and through the web view's sign-in."""

from __future__ import annotations

from dataclasses import replace

import grpc
import httpx
import orjson
import pytest

from extproc._proto import replay_pb2, replay_pb2_grpc
from extproc.config import Admin, ConfigError
from extproc.core.router import LocalDriver
from extproc.observability.replay import ReplayStore
from extproc.service.admin import COOKIE, AdminAuth, Caller, Denied, load_token
from extproc.service.app import start
from extproc.types import Api, ResponseSummary

TOKEN = "admin-token-for-the-tests-0123"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
ALICE = {"authorization": "Bearer sk-alice"}
BOB = {"x-api-key": "sk-bob"}
BODY = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "refactor"}]})


async def _running(config, tmp_path, token: str | None):
    admin = Admin()
    if token is not None:
        path = tmp_path / "token"
        path.write_text(token + "\n")
        admin = Admin(token_file=str(path))
    return await start(replace(config, admin=admin,
                               server=replace(config.server, grpc_port=0, http_port=0)))


def _route(service, credential: dict[str, str], session: str) -> str:
    driver = LocalDriver(service.parts.router)
    routed = driver.route(Api.CHAT, {**credential, "x-session-id": session}, BODY)
    driver.respond(routed, ResponseSummary(status=200, finish_reason="stop"))
    return routed.replay_id


@pytest.fixture
async def service(config, tmp_path):
    running = await _running(config, tmp_path, TOKEN)
    yield running
    await running.stop()


@pytest.fixture
async def http(service):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}") as client:
        yield client


async def test_without_a_token_the_admin_surfaces_say_how_to_configure_one(config, tmp_path):
    service = await _running(config, tmp_path, None)
    try:
        replay_id = _route(service, ALICE, "s1")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}") as http:
            for path in (f"/v1/replay/{replay_id}", "/v1/replay?session_id=s1", "/v1/sessions",
                         "/v1/timeline?session_id=s1"):
                response = await http.get(path, headers=ALICE)
                assert response.status_code == 403, path
                assert "admin.token_file" in response.json()["error"]
            page = await http.get("/ui")
            assert page.status_code == 403 and "admin.token_file" in page.text
            assert (await http.get("/metrics")).status_code == 200
            assert (await http.get("/healthz")).status_code == 200
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            stub = replay_pb2_grpc.ReplayStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetRecord(replay_pb2.GetRecordRequest(replay_id=replay_id),
                                     metadata=tuple(ADMIN.items()))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "admin.token_file" in info.value.details()
    finally:
        await service.stop()


async def test_no_credential_is_401_and_the_open_endpoints_stay_open(service, http):
    replay_id = _route(service, ALICE, "s1")
    response = await http.get(f"/v1/replay/{replay_id}")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert (await http.get("/v1/sessions")).status_code == 401
    assert (await http.get("/metrics")).status_code == 200
    assert (await http.get("/healthz")).json() == {"status": "ok"}


async def test_the_admin_sees_every_tenant_and_a_tenant_only_its_own(service, http):
    alice = _route(service, ALICE, "shared-name")
    bob = _route(service, BOB, "shared-name")
    for replay_id in (alice, bob):
        assert (await http.get(f"/v1/replay/{replay_id}", headers=ADMIN)).status_code == 200
    mine = await http.get(f"/v1/replay/{alice}", headers=ALICE)
    assert mine.status_code == 200 and mine.json()["replay_id"] == alice
    theirs = await http.get(f"/v1/replay/{bob}", headers=ALICE)
    unknown = await http.get("/v1/replay/rp-no-such-id", headers=ALICE)
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json() == unknown.json(), "another tenant's id looks exactly like a missing one"
    # Bob's own credential, sent the way Anthropic clients send it, finds his record.
    assert (await http.get(f"/v1/replay/{bob}", headers=BOB)).status_code == 200

    def ids(response: httpx.Response) -> set[str]:
        return {r["replay_id"] for r in response.json()["records"]}

    session = "/v1/replay?session_id=shared-name"
    assert ids(await http.get(session, headers=ADMIN)) == {alice, bob}
    assert ids(await http.get(session, headers=ALICE)) == {alice}
    assert ids(await http.get(session, headers=BOB)) == {bob}
    tenant_of_bob = (await http.get(f"/v1/replay/{bob}", headers=ADMIN)).json()["session"]["tenant"]
    assert ids(await http.get(f"{session}&tenant={tenant_of_bob}", headers=ADMIN)) == {bob}
    # A tenant cannot widen its scope by naming another tenant.
    assert ids(await http.get(f"{session}&tenant={tenant_of_bob}", headers=ALICE)) == {alice}
    listed = (await http.get("/v1/sessions", headers=ALICE)).json()["sessions"]
    assert [(s["session_id"], s["turns"]) for s in listed] == [("shared-name", 1)]
    assert len((await http.get("/v1/sessions", headers=ADMIN)).json()["sessions"]) == 2
    timeline = (await http.get("/v1/timeline?session_id=shared-name", headers=ALICE)).json()
    assert {e["args"]["replay_id"] for e in timeline["traceEvents"]
            if e.get("cat") == "turn"} == {alice}


async def test_a_spoofed_tenant_header_widens_nothing(config, tmp_path):
    """With ``identity.tenant_header`` the LLM paths trust a header an auth filter sets; the
    admin port is not behind that filter, so the header counts for nothing there."""
    config = replace(config, identity=replace(config.identity, tenant_header="x-tenant-id"))
    service = await _running(config, tmp_path, TOKEN)
    try:
        replay_id = _route(service, {"x-tenant-id": "acme"}, "s1")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}") as http:
            forged = await http.get(f"/v1/replay/{replay_id}",
                                    headers={"x-tenant-id": "acme", **ALICE})
            assert forged.status_code == 404
            assert (await http.get(f"/v1/replay/{replay_id}", headers=ADMIN)).status_code == 200
    finally:
        await service.stop()


async def test_grpc_replay_answers_by_credential(service):
    alice = _route(service, ALICE, "g1")
    bob = _route(service, BOB, "g1")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = replay_pb2_grpc.ReplayStub(channel)

        async def code(replay_id: str, metadata: dict[str, str]) -> grpc.StatusCode:
            try:
                await stub.GetRecord(replay_pb2.GetRecordRequest(replay_id=replay_id),
                                     metadata=tuple(metadata.items()))
            except grpc.aio.AioRpcError as error:
                return error.code()
            return grpc.StatusCode.OK

        assert await code(alice, {}) == grpc.StatusCode.UNAUTHENTICATED
        assert await code(alice, ADMIN) == grpc.StatusCode.OK
        assert await code(bob, ADMIN) == grpc.StatusCode.OK
        assert await code(alice, ALICE) == grpc.StatusCode.OK
        assert await code(bob, ALICE) == grpc.StatusCode.NOT_FOUND
        listed = await stub.ListSession(replay_pb2.ListSessionRequest(session_id="g1"),
                                        metadata=tuple(ALICE.items()))
        assert [r["replay_id"] for r in listed.records] == [alice]
        listed = await stub.ListSession(replay_pb2.ListSessionRequest(session_id="g1"),
                                        metadata=tuple(ADMIN.items()))
        assert {r["replay_id"] for r in listed.records} == {alice, bob}


async def test_the_web_view_signs_in_with_a_cookie(service, http):
    _route(service, ALICE, "ui-1")

    async def sign_in(token: str) -> httpx.Response:
        response = await http.post("/ui/login", data={"token": token})
        http.cookies.clear()  # every request below names its cookie itself
        return response

    def jar(value: str) -> dict[str, str]:
        return {"cookie": f"{COOKIE}={value}"}

    page = await http.get("/ui")
    assert page.status_code == 401 and 'name="token"' in page.text
    assert (await sign_in("")).status_code == 401
    signed = await sign_in(TOKEN)
    assert signed.status_code == 303 and signed.headers["location"] == "/ui"
    cookie = signed.cookies[COOKIE]
    assert "httponly" in signed.headers["set-cookie"].lower()
    assert "samesite=strict" in signed.headers["set-cookie"].lower()
    assert TOKEN not in cookie
    view = await http.get("/ui", headers=jar(cookie))
    assert view.status_code == 200 and "Recent sessions" in view.text
    assert "admin: every tenant" in view.text
    assert (await http.get("/v1/sessions", headers=jar(cookie))).json()["sessions"]
    tampered = cookie[:-1] + ("0" if cookie[-1] != "0" else "1")
    assert (await http.get("/v1/sessions", headers=jar(tampered))).status_code == 401
    as_alice = (await sign_in("sk-alice")).cookies[COOKIE]
    sessions = await http.get("/v1/sessions", headers=jar(as_alice))
    assert [s["session_id"] for s in sessions.json()["sessions"]] == ["ui-1"]


def test_replay_ids_are_unguessable():
    ids = [ReplayStore.new_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("rp-") and len(i) == 3 + 22 for i in ids)
    # No shared stem a neighbour could be counted from: the first 8 characters already differ.
    assert len({i[:11] for i in ids}) == len(ids)


def test_auth_decides_by_the_token_the_credential_and_the_cookie():
    auth = AdminAuth(TOKEN, lambda headers: "k-" + "|".join(sorted(headers.values())))
    assert auth.caller(ADMIN) == Caller(None)
    assert auth.caller({"authorization": f"bearer {TOKEN}"}) == Caller(None)
    assert auth.caller({"authorization": f"Bearer {TOKEN}x"}).tenant == f"k-Bearer {TOKEN}x"
    assert auth.caller(BOB) == Caller("k-sk-bob")
    with pytest.raises(Denied) as info:
        auth.caller({})
    assert info.value.status == 401
    cookie = auth.cookie(Caller("k-sk-bob"))
    assert auth.caller({}, cookie) == Caller("k-sk-bob")
    expired = auth.cookie(Caller(None), now=1.0)
    with pytest.raises(Denied):
        auth.caller({}, expired)
    other = AdminAuth("another-admin-token-0123456", lambda h: "k")
    with pytest.raises(Denied):
        other.caller({}, cookie)  # signed with another token's key


def test_a_configured_token_source_that_is_unusable_fails_at_start(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_token(Admin(token_file=str(tmp_path / "missing")))
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(ConfigError, match="at least 16"):
        load_token(Admin(token_file=str(short)))
    assert load_token(Admin(token_env="SAAR_TOKEN"), {"SAAR_TOKEN": f" {TOKEN}\n"}) == TOKEN
    with pytest.raises(ConfigError, match="SAAR_TOKEN"):
        load_token(Admin(token_env="SAAR_TOKEN"), {})
    assert load_token(Admin()) is None
