"""Session identity from the headers real agent harnesses send, then from the body, scoped by
tenant.

Precedence: the harness headers (Dynamo's canonical header first), then a session id the body
names (Anthropic ``metadata.user_id``, where Claude Code puts its session; the Responses
``prompt_cache_key``, Codex's conversation id). A caller that names nothing (Qwen Code by
default) is followed by the ids its history holds: a ``previous_response_id``, a tool call or a
provider-state blob belongs to the session whose answer issued it (the owner the locks already
record; resolved by the store, see ``chained``), so a run's turns and its resumes are one
session. A first request (no answer in its history) opens a new session (``opened``): two runs
that open alike never merge; when its first user message carries the task text of a tool
call another session's answer issued (a sub-agent's task), that session is its parent
(``parented``), and the new session's record keeps it. Only a conversation that carries no
such id at all is named by its fingerprint (system prompt and first user turn, reminders
left out).

Values are client-controlled, so they are capped and keyed under the caller's tenant: one caller
can name any session it likes but only ever reaches its own.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import orjson
import xxhash

from ..types import RequestSummary, SessionIdentity

_TRUE = frozenset({"true", "1", "yes"})
CONVERSATION_PREFIX = "c-"
OPENING = "opening"
"""The source of a session that a first request opened (it named none)."""


@dataclass(frozen=True, slots=True)
class HarnessHeaders:
    """One harness's header names: its session id and, when it has them, its parent link.

    A harness with a ``child`` header (Claude Code) names sub-agents under a root session: a child
    is its own session, and its parent is the ``parent`` header or else the root.
    """

    session: str
    parent: str | None = None
    child: str | None = None


# Highest precedence first: Dynamo's canonical header wins over every harness header.
HARNESSES: tuple[HarnessHeaders, ...] = (
    HarnessHeaders("x-dynamo-session-id", "x-dynamo-parent-session-id"),
    HarnessHeaders(
        "x-claude-code-session-id", "x-claude-code-parent-agent-id", "x-claude-code-agent-id"
    ),
    HarnessHeaders("thread-id", "x-codex-parent-thread-id"),
    HarnessHeaders("session-id", "x-codex-parent-thread-id"),
    HarnessHeaders("x-deepseek-harness-session-id", "x-deepseek-harness-parent-session-id"),
    HarnessHeaders("x-session-id", "x-parent-session-id"),
    HarnessHeaders("x-conversation-id"),
)


@dataclass(frozen=True, slots=True)
class IdentityReader:
    """Reads ``SessionIdentity`` from lower-cased request headers.

    ``tenant_header`` names a header set by a trusted filter in front of the processor (for example
    an auth filter); without it the tenant is a keyed hash of the caller's credential: with the
    ``secret`` (shared by replicas, never in a record) nobody can test guesses of a credential
    against a tenant id seen in a replay record.
    """

    tenant_header: str | None = None
    extra_session_headers: tuple[str, ...] = ()
    max_value_bytes: int = 256
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    _harnesses: tuple[HarnessHeaders, ...] = field(default=(), init=False, repr=False)

    def read(
        self, headers: Mapping[str, str], request: RequestSummary | None = None
    ) -> SessionIdentity:
        """The session the headers name, else the body's hint; else ``session_id`` is None
        when the chain tells (the ids of the history) or a first request opens a new session
        (``opens``), and the conversation's fingerprint when neither does."""
        tenant = self._tenant(headers)
        final = headers.get("x-dynamo-session-final", "").strip().lower() in _TRUE
        compaction = _is_compaction(headers.get("x-codex-turn-metadata"))
        for harness in self.harnesses:
            value = headers.get(harness.session)
            if not value or not value.strip():
                continue
            session, parent = self._session_and_parent(harness, headers, self._cap(value))
            return SessionIdentity(tenant, session, harness.session, parent, final, compaction)
        if request is not None and request.session_hint:
            return SessionIdentity(tenant, self._cap(request.session_hint),
                                   request.session_hint_source, None, final, compaction)
        if request is None:
            return SessionIdentity(tenant, None, None, None, final, compaction)
        conversation = CONVERSATION_PREFIX + request.conversation if request.conversation else None
        if request.trail is not None:  # the session that got the ids, found by the store
            return SessionIdentity(tenant, None, None, None, final, compaction,
                                   fallback=conversation)
        if request.opening:  # two runs that open alike are two sessions
            return SessionIdentity(tenant, None, OPENING, None, final, compaction, opens=True)
        return SessionIdentity(tenant, conversation, "conversation" if conversation else None,
                               None, final, compaction)

    @property
    def harnesses(self) -> tuple[HarnessHeaders, ...]:
        return self._harnesses

    def __post_init__(self) -> None:
        extra = tuple(HarnessHeaders(h.lower()) for h in self.extra_session_headers)
        object.__setattr__(self, "_harnesses", HARNESSES + extra)

    def _session_and_parent(
        self, harness: HarnessHeaders, headers: Mapping[str, str], root: str
    ) -> tuple[str, str | None]:
        parent = self._header(headers, harness.parent)
        if harness.child is not None:
            child = self._header(headers, harness.child)
            return (child, parent or root) if child else (root, None)
        return root, parent if parent != root else None

    def _header(self, headers: Mapping[str, str], name: str | None) -> str | None:
        value = headers.get(name) if name else None
        return self._cap(value) if value else None

    def _tenant(self, headers: Mapping[str, str]) -> str:
        tenant = self._header(headers, self.tenant_header)
        if tenant:
            return "t-" + tenant
        credential = headers.get("authorization") or headers.get("x-api-key")
        if credential:
            return "k-" + self.tenant_of(credential)
        return "anonymous"

    def tenant(self, headers: Mapping[str, str]) -> str:
        """The tenant ``read`` gives these headers: the admin API scopes a caller's lookups by
        the tenant its LLM credential routes under."""
        return self._tenant(headers)

    def tenant_of(self, credential: str) -> str:
        """The keyed hash a credential is known by (96 bits: no collision in practice)."""
        return hashlib.blake2b(credential.encode(), key=self.secret, digest_size=12).hexdigest()

    def _cap(self, value: str) -> str:
        """Keep ids short and printable: a longer value, or one with control characters (the
        store separates fields with NUL), is replaced by its hash, never truncated into a
        clash."""
        value = value.strip()
        if len(value.encode()) <= self.max_value_bytes and value.isprintable():
            return value
        return "h-" + xxhash.xxh3_128_hexdigest(value.encode("utf-8", "surrogatepass"))


def chained(identity: SessionIdentity, session_key: str | None) -> SessionIdentity:
    """``identity`` once the store resolved its chain to ``session_key`` (``tenant/id``), or
    to nothing known: then its ``fallback``, if it has one."""
    if identity.session_id is not None:
        return identity
    prefix = identity.tenant + "/"
    if session_key is not None and session_key.startswith(prefix):  # never another tenant's
        return replace(identity, session_id=session_key[len(prefix):], source="chain")
    if identity.fallback is not None:
        return replace(identity, session_id=identity.fallback, source="conversation")
    return identity


def opened(identity: SessionIdentity, name: str) -> SessionIdentity:
    """``identity`` of a first request that names no session, given the new session's
    ``name`` (the replay id of the request that opened it: unique, and it names where the
    session began)."""
    if not identity.opens or identity.session_id is not None:
        return identity
    return replace(identity, session_id=CONVERSATION_PREFIX + name)


def parented(identity: SessionIdentity, remembered: str | None,
             spawner: str | None) -> SessionIdentity:
    """``identity`` with its parent when the request names none: the parent its session's
    record ``remembered``, else, for a first request that opened a session, ``spawner`` (the
    session, ``tenant/id``, whose answer's tool call carried the task the request opens
    with: Qwen Code's sub-agents name nothing else of their parent)."""
    if identity.parent_session_id is not None or identity.session_id is None:
        return identity
    parent = remembered
    prefix = identity.tenant + "/"
    if parent is None and identity.opens and spawner is not None and spawner.startswith(prefix):
        parent = spawner[len(prefix):]
    if parent is None or parent == identity.session_id:
        return identity
    return replace(identity, parent_session_id=parent)


def _is_compaction(metadata: str | None) -> bool:
    if not metadata:
        return False
    try:
        parsed = orjson.loads(metadata)
    except orjson.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and parsed.get("request_kind") == "compaction"
