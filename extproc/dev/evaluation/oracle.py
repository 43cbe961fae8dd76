"""The independent judge of the matrix: who issued which id, and what each served turn broke.

The router learns ownership from responses; the oracle learns it from minting them, and it learns
what a request carries from the simulated client that built it, never from the router's parse or
labels. A switch is a change of served model inside a session; a switch is unsafe when the turn
hands tool results, a ``previous_response_id`` or encrypted reasoning to a model that did not
issue them (what a continuity-enforcing backend would reject).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import xxhash


class Unsafe(enum.StrEnum):
    TOOL_LOOP = "tool_loop"
    PROVIDER_STATE = "provider_state"


@dataclass(frozen=True, slots=True)
class Carried:
    """The non-portable references one request carries, as its client built them."""

    tool_results: tuple[str, ...] = ()
    provider_state: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    switched: bool
    unsafe: Unsafe | None


class Oracle:
    def __init__(self) -> None:
        self._issuer: dict[str, str] = {}
        self._served: dict[str, str] = {}

    def mint(self, kind: str, model: str, *parts: object) -> str:
        """An opaque id issued by ``model``: nothing in it names the model."""
        key = "/".join(str(p) for p in (model, *parts))
        minted = f"{kind}_{xxhash.xxh3_64_hexdigest(key.encode())}"
        self._issuer[minted] = model
        return minted

    def judge(self, session: str, served: str, carried: Carried) -> Verdict:
        """Count one served turn. A turn with foreign tool results is a tool-loop violation even
        when it also carries foreign provider state: each violation is counted once."""
        previous = self._served.get(session)
        self._served[session] = served
        unsafe = None
        if self._foreign(carried.tool_results, served):
            unsafe = Unsafe.TOOL_LOOP
        elif self._foreign(carried.provider_state, served):
            unsafe = Unsafe.PROVIDER_STATE
        return Verdict(previous is not None and previous != served, unsafe)

    def _foreign(self, ids: tuple[str, ...], served: str) -> bool:
        return any(self._issuer.get(i, served) != served for i in ids)
