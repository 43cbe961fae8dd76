"""The continuity oracle: every id a backend issues, and a verdict on every request it receives.

A real provider can only continue state it created: a ``previous_response_id`` it stored, a tool
call it made, encrypted reasoning or a thinking signature it can decrypt or verify. The simulator
records each such id as it issues it and counts a violation whenever a request leans on one it
did not issue, which is precisely a routing mistake. State grows with traffic until ``reset``;
nothing is evicted, because forgetting an id would report a false violation.
"""

from __future__ import annotations

import itertools
import secrets
from collections import Counter
from dataclasses import dataclass

from ...apis import fingerprint
from ...types import RequestSummary

VIOLATION_KINDS = ("previous_response", "tool_call", "provider_state")


@dataclass(frozen=True, slots=True)
class Verdict:
    """Violations found in one request; ``unknown_previous_response`` makes it unanswerable."""

    violations: tuple[str, ...] = ()
    unknown_previous_response: bool = False


class ContinuityOracle:
    """Issues ids tagged with the instance and judges requests against what it issued."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self.violations: Counter[str] = Counter(dict.fromkeys(VIOLATION_KINDS, 0))
        self.continued: Counter[str] = Counter(dict.fromkeys(VIOLATION_KINDS, 0))
        """What requests leaned on that this instance did issue: tests see that the
        continuity they check was exercised at all."""
        self._sequence = itertools.count(1)
        self._tool_calls: set[str] = set()
        self._provider_state: set[str] = set()
        self._responses: dict[str, tuple[str | None, str]] = {}

    def new_id(self, prefix: str) -> str:
        """A unique id naming this instance; the random tail keeps ids unique across resets."""
        return f"{prefix}{self.instance_id}-{next(self._sequence)}-{secrets.token_hex(3)}"

    def issue_tool_call(self, prefix: str) -> str:
        call_id = self.new_id(prefix)
        self._tool_calls.add(call_id)
        return call_id

    def issue_opaque(self, kind: str) -> str:
        """A provider-bound blob (encrypted reasoning, thinking signature) only we can read."""
        blob = f"sim{secrets.token_urlsafe(24)}{self.new_id('_')}"
        self._provider_state.add(fingerprint(kind, blob))
        return blob

    def record_response(self, response_id: str, previous_id: str | None, text: str) -> None:
        """Store a Responses id with the text it added after ``previous_id``'s transcript.

        Storing only the increment keeps a long ``previous_response_id`` chain linear in size.
        """
        self._responses[response_id] = (previous_id, text)

    def transcript(self, response_id: str | None) -> str:
        """The full conversation a response id stands for, oldest text first."""
        parts: list[str] = []
        while response_id is not None and response_id in self._responses:
            response_id, text = self._responses[response_id]
            parts.append(text)
        return "".join(reversed(parts))

    def judge(self, summary: RequestSummary) -> Verdict:
        """Count every id ``summary`` relies on that this instance did not issue."""
        found: list[str] = []
        unknown_previous = (
            summary.previous_response_id is not None
            and summary.previous_response_id not in self._responses
        )
        if unknown_previous:
            found.append("previous_response")
        found.extend("tool_call" for i in summary.tool_result_ids if i not in self._tool_calls)
        found.extend(
            "provider_state" for key in summary.provider_state if key not in self._provider_state
        )
        self.violations.update(found)
        if summary.previous_response_id is not None and not unknown_previous:
            self.continued["previous_response"] += 1
        self.continued["tool_call"] += sum(i in self._tool_calls for i in summary.tool_result_ids)
        self.continued["provider_state"] += sum(
            key in self._provider_state for key in summary.provider_state)
        return Verdict(tuple(found), unknown_previous)

    def issued_counts(self) -> dict[str, int]:
        return {
            "tool_call": len(self._tool_calls),
            "response": len(self._responses),
            "provider_state": len(self._provider_state),
        }

    def reset(self) -> None:
        self.violations = Counter(dict.fromkeys(VIOLATION_KINDS, 0))
        self.continued = Counter(dict.fromkeys(VIOLATION_KINDS, 0))
        self._tool_calls.clear()
        self._provider_state.clear()
        self._responses.clear()
