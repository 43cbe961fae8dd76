from __future__ import annotations

import pytest

from extproc.core.identity import IdentityReader

reader = IdentityReader(extra_session_headers=("X-Custom-Session",))


@pytest.mark.parametrize(
    ("headers", "session", "parent", "source"),
    [
        ({"x-session-id": "s1"}, "s1", None, "x-session-id"),
        ({"x-session-id": "s1", "x-parent-session-id": "p"}, "s1", "p", "x-session-id"),
        ({"x-dynamo-session-id": "d", "x-session-id": "s"}, "d", None, "x-dynamo-session-id"),
        ({"x-dynamo-session-id": "d", "x-dynamo-parent-session-id": "d"}, "d", None,
         "x-dynamo-session-id"),
        ({"x-claude-code-session-id": "root"}, "root", None, "x-claude-code-session-id"),
        ({"x-claude-code-session-id": "root", "x-claude-code-agent-id": "a1"}, "a1", "root",
         "x-claude-code-session-id"),
        ({"x-claude-code-session-id": "root", "x-claude-code-agent-id": "a2",
          "x-claude-code-parent-agent-id": "a1"}, "a2", "a1", "x-claude-code-session-id"),
        ({"thread-id": "t", "x-codex-parent-thread-id": "pt"}, "t", "pt", "thread-id"),
        ({"session-id": "old-codex"}, "old-codex", None, "session-id"),
        ({"x-deepseek-harness-session-id": "ds"}, "ds", None, "x-deepseek-harness-session-id"),
        ({"x-conversation-id": "c"}, "c", None, "x-conversation-id"),
        ({"x-custom-session": "cs"}, "cs", None, "x-custom-session"),
        ({}, None, None, None),
    ],
)
def test_harness_headers(headers, session, parent, source):
    identity = reader.read(headers)
    assert (identity.session_id, identity.parent_session_id, identity.source) == (
        session, parent, source)


def test_tenant_scopes_the_session_key():
    a = reader.read({"x-session-id": "same", "authorization": "Bearer alice"})
    b = reader.read({"x-session-id": "same", "authorization": "Bearer bob"})
    assert a.session_id == b.session_id
    assert a.key != b.key
    assert "alice" not in a.key


def test_trusted_tenant_header():
    trusted = IdentityReader(tenant_header="x-tenant-id")
    identity = trusted.read({"x-tenant-id": "acme", "x-session-id": "s", "authorization": "k"})
    assert identity.key == "t-acme/s"


def test_long_values_are_hashed_not_truncated():
    a = reader.read({"x-session-id": "x" * 300 + "a"})
    b = reader.read({"x-session-id": "x" * 300 + "b"})
    assert a.session_id != b.session_id
    assert len(a.session_id) < 64


@pytest.mark.parametrize(("value", "final"), [("true", True), ("1", True), ("YES", True),
                                               ("no", False), ("", False)])
def test_session_final(value, final):
    assert reader.read({"x-dynamo-session-final": value}).final is final


def test_codex_compaction_flag():
    assert reader.read({"x-codex-turn-metadata": '{"request_kind": "compaction"}'}).compaction
    assert not reader.read({"x-codex-turn-metadata": "not json"}).compaction


def test_the_tenant_is_a_keyed_hash_of_the_credential():
    """Issue 9 item 12: without the secret, a tenant id in a record reveals nothing."""
    one, two = IdentityReader(secret=b"s" * 32), IdentityReader(secret=b"t" * 32)
    headers = {"authorization": "Bearer alice"}
    assert one.read(headers).tenant == IdentityReader(secret=b"s" * 32).read(headers).tenant
    assert one.read(headers).tenant != two.read(headers).tenant
    assert one.read(headers).tenant != one.read({"x-api-key": "bob"}).tenant
    import xxhash

    assert xxhash.xxh3_64_hexdigest(b"Bearer alice") not in one.read(headers).tenant


def summary(**fields):
    from extproc.types import Api, RequestSummary

    return RequestSummary(Api.CHAT, "auto", False, 2, 10, **fields)


@pytest.mark.parametrize(
    ("headers", "fields", "session", "source"),
    [
        ({"x-session-id": "h"}, {"session_hint": "body"}, "h", "x-session-id"),
        ({}, {"session_hint": "user_1_session_9", "session_hint_source": "metadata.user_id"},
         "user_1_session_9", "metadata.user_id"),
        ({}, {"session_hint": "conv-7", "session_hint_source": "prompt_cache_key"},
         "conv-7", "prompt_cache_key"),
        ({}, {"conversation": "ab12"}, "c-ab12", "conversation"),
        # A chain names its session through the store, not the fingerprint of "go on".
        ({}, {"conversation": "ab12", "previous_response_id": "resp_1"}, None, None),
        # So does any id of the history an answer issued: a tool call, a provider blob.
        ({}, {"conversation": "ab12", "tool_call_ids": ("call_1",)}, None, None),
        ({}, {"conversation": "ab12", "provider_state": ("thinking:9",)}, None, None),
        # A first request names nothing: ``route`` opens a session for it.
        ({}, {"conversation": "ab12", "opening": True}, None, "opening"),
        ({}, {"session_hint": "hint", "conversation": "ab12", "opening": True}, "hint", None),
        ({}, {"session_hint": "hint", "conversation": "ab12"}, "hint", None),
        ({}, {}, None, None),
    ],
)
def test_the_body_names_a_session_below_the_headers(headers, fields, session, source):
    identity = reader.read(headers, summary(**fields))
    assert identity.session_id == session
    if source is not None:
        assert identity.source == source


def test_a_chain_resolves_only_within_its_tenant():
    from extproc.core.identity import chained

    identity = reader.read({"authorization": "Bearer a"},
                           summary(previous_response_id="resp_1"))
    resolved = chained(identity, f"{identity.tenant}/s-9")
    assert (resolved.session_id, resolved.source) == ("s-9", "chain")
    assert chained(identity, "k-other/s-9").session_id is None


@pytest.mark.parametrize(
    ("fields", "resolved", "session", "source"),
    [
        # The chain resolved: the session that got the ids.
        ({"tool_call_ids": ("call_1",), "conversation": "ab12"}, "s-9", "s-9", "chain"),
        # It leads nowhere known (the ids expired, or came from elsewhere): the fingerprint.
        ({"tool_call_ids": ("call_1",), "conversation": "ab12"}, None, "c-ab12",
         "conversation"),
        # A response chain has no fingerprint to fall back on.
        ({"previous_response_id": "resp_1"}, None, None, None),
    ],
)
def test_a_chain_that_leads_nowhere_falls_back_to_the_fingerprint(fields, resolved, session,
                                                                  source):
    from extproc.core.identity import chained

    identity = reader.read({"authorization": "Bearer a"}, summary(**fields))
    key = None if resolved is None else f"{identity.tenant}/{resolved}"
    found = chained(identity, key)
    assert (found.session_id, found.source) == (session, source)


def test_a_first_request_opens_a_session_named_by_its_replay_id():
    from extproc.core.identity import opened

    identity = reader.read({}, summary(opening=True, conversation="ab12"))
    assert opened(identity, "rp-1").session_id == "c-rp-1"
    named = reader.read({"x-session-id": "s"}, summary(opening=True))
    assert opened(named, "rp-1").session_id == "s"


@pytest.mark.parametrize(
    ("headers", "fields", "remembered", "spawner", "parent"),
    [
        # A first request naming nothing, whose task a session's tool call gave: its child.
        ({}, {"opening": True}, None, "T/s-run", "s-run"),
        # ... but only a session of its own tenant.
        ({}, {"opening": True}, None, "k-other/s-run", None),
        # A later turn of that sub-agent: the parent its record remembers.
        ({}, {"tool_call_ids": ("call_1",)}, "s-run", None, "s-run"),
        # A continuation is never re-parented by a task mark, only by its record.
        ({}, {"tool_call_ids": ("call_1",)}, None, "T/s-run", None),
        # Headers that name the parent win over both.
        ({"x-session-id": "s", "x-parent-session-id": "p"}, {}, "q", "T/s-run", "p"),
        # Nothing spawned it: a root.
        ({}, {"opening": True}, None, None, None),
    ],
)
def test_a_session_that_names_no_parent_gets_the_one_its_task_or_record_tells(
        headers, fields, remembered, spawner, parent):
    from extproc.core.identity import chained, opened, parented

    identity = IdentityReader(tenant_header="x-tenant").read(
        {"x-tenant": "1", **headers}, summary(**fields))
    resolved = opened(chained(identity, f"{identity.tenant}/s-sub"), "rp-1")
    spawned = None if spawner is None else spawner.replace("T/", f"{identity.tenant}/")
    assert parented(resolved, remembered, spawned).parent_session_id == parent


def test_control_characters_never_reach_a_key():
    """The store separates fields with NUL: an id holding one is hashed, like a long one."""
    identity = reader.read({"x-session-id": "a\x00b"})
    assert identity.session_id.startswith("h-") and "\x00" not in identity.key
