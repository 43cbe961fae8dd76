"""Side requests: what a harness sends beside its main loop under the same session, which must
neither place nor move the session.

OpenCode's first request of a session is a title request ("You are a title generator…", no
tools, to its ``small_model``); Claude Code makes small tool-less calls to a haiku model. Taken
as turns, they decide the session's model and bind its worker before the main loop's first
request arrives, and count as turns of the session. The rule, on facts a request carries and the
session's record:

* a request is **light** when it opens a conversation of its own (no answer in its history),
  offers no tools, continues no tool call and holds at most ``max_tokens`` context tokens;
* a session's **usual model** is the model named (the body's ``model``) by its latest request
  that was not light (``SessionRecord.requested``); a session that made only light requests has
  none yet;
* a light request naming a model other than its session's usual one is a **side request**:
  served (SAAR and the scheduler decide it as a first request of its own), but it writes nothing
  to the session — no model, no worker, no turn;
* a light request in a session with no usual model counts, **provisionally** (a plain chat of
  light requests keeps its session as before); the first request after them that offers tools
  and opens its conversation (an agent's main loop's first) is placed as the session's
  **first** request, and its commit starts the session's record afresh.

``max_tokens`` 0 turns the rule off: every request is a turn of its session.
"""

from __future__ import annotations

from enum import Enum

from ..state.records import SessionRecord
from ..types import RequestSummary


class Standing(Enum):
    """What a request is to its session."""

    MAIN = "main"
    """A turn: it counts, binds the session and names its usual model."""
    PROVISIONAL = "provisional"
    """A light turn of a session with no usual model yet: it counts until the main loop's
    first request replaces it."""
    SIDE = "side"
    """Served beside the session: nothing of it is written to the session."""
    FIRST = "first"
    """The main loop's first request (it offers tools) after only light ones: placed as a
    first request, and the session's record starts afresh with it."""


def light(request: RequestSummary, max_tokens: int) -> bool:
    """A small, tool-less request that opens a conversation of its own."""
    return (max_tokens > 0 and request.opening and not request.tools_offered
            and not request.pending_tool_results and request.context_tokens <= max_tokens)


def standing(request: RequestSummary, state: SessionRecord | None, max_tokens: int) -> Standing:
    """Where ``request`` stands in the session whose record is ``state`` (None: no record)."""
    usual = state.requested if state is not None else None
    if light(request, max_tokens):
        if usual is None:
            return Standing.PROVISIONAL
        return Standing.SIDE if request.model != usual else Standing.MAIN
    if (max_tokens > 0 and request.opening and request.tools_offered and state is not None
            and usual is None):
        return Standing.FIRST
    return Standing.MAIN
