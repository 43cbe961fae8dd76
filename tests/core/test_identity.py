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
