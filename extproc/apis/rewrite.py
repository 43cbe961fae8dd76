"""The top-level ``model`` of a raw body, read and replaced without parsing the body.

Re-serialising a parsed body changes more than its model: integers beyond 64 bits (orjson reads
them as floats), duplicate keys (all but the last vanish), key order, escapes and whitespace.
``rewrite_model`` splices the new model into the bytes the client sent instead, replacing the
value of every top-level ``"model"`` key (an upstream may read the first of duplicate keys
where orjson reads the last) and nothing else: nested objects keep their own ``"model"`` keys.
``peek_model`` reads the top-level model as ``orjson.loads`` would (the last one wins), cheaply
enough to reject an unknown model before parsing an 8 MiB body.

Why it is cheap: one search over the bytes finds every string that spells "model" (escapes
included) followed by a colon, usually one. Whether such a key sits in the top-level object is
its bracket depth outside strings, counted over the shorter side of the body with C-speed byte
operations (escaped backslashes and quotes dropped, strings cut away), so the large
``messages`` array in the middle of an agent body is only searched, never walked. Each such key
costs a few microseconds, so a body with more than ``MAX_MODEL_KEYS`` of them (nested ones
included; no client sends that many, an attacker could send 700,000 in 8 MiB) is refused.
"""

from __future__ import annotations

import itertools
import re

import orjson

from ..errors import MalformedRequest, MissingModel
from .common import nonempty_str

MAX_MODEL_KEYS = 16_384
"""Keys spelling "model" at any depth a body may hold: some 60 ms of scanning at most."""

_KEY = re.compile(
    rb'"(?:m|\\u006[dD])(?:o|\\u006[fF])(?:d|\\u0064)(?:e|\\u0065)(?:l|\\u006[cC])"'
    rb"[ \t\n\r]*:[ \t\n\r]*"
)
"""A string spelling "model" in any escapes, then a colon: a key, if its quote is not escaped."""
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)
_SCALAR = re.compile(rb"[-+.0-9A-Za-z]+")
_TO_BRACKET = re.compile(rb'(?:[^"\[\]{}]++|"[^"\\]*+(?:\\.[^"\\]*+)*+")*+[\[\]{}]', re.DOTALL)
"""Everything up to the next bracket outside strings, that bracket included."""


Spans = list[tuple[int, int]]
"""(start, end) of the value of every top-level "model" key, in order."""


def model_spans(raw: bytes, *, thorough: bool = True) -> Spans | None:
    """Where the top-level model values of ``raw`` are, found once for ``peek_model`` and
    ``rewrite_model`` (None: the scan could not tell; they then raise or answer None).

    Each search over a large body costs about what parsing it does. ``thorough`` finds every
    top-level "model" key, escaped spellings too when the body holds a ``\\u006`` escape at
    all. Without it (the router's fast path) only the last top-level key is found — the one
    orjson, like most parsers, reads — searched from the end: SDKs write the model after the
    messages, so little is searched; a body with no plain key falls back to the thorough
    search, and the caller checks the span against the model its parse read and asks again,
    thoroughly, if they differ. An earlier duplicate key is then left as the client sent it:
    only a parser that keeps the first duplicate would read it, and only the client's own
    request could suffer (a model its upstream does not serve)."""
    try:
        return _model_values(raw, thorough) if thorough else (
            _last_value(raw) or _model_values(raw, True))
    except MalformedRequest:
        return None


def peek_model(raw: bytes, spans: Spans | None = None) -> str | None:
    """The top-level model string of a JSON object body, or None (none, not a string, not
    valid JSON as far as the scan could tell, or too many "model" keys: ``parse_request`` and
    ``rewrite_model`` have the last word). ``spans`` from ``model_spans`` saves the scan."""
    if spans is None:
        spans = model_spans(raw)
    if not spans:
        return None
    start, end = spans[-1]
    try:
        return nonempty_str(orjson.loads(raw[start:end]))
    except orjson.JSONDecodeError:
        return None


def rewrite_model(raw: bytes, model: str, spans: Spans | None = None) -> bytes:
    """``raw`` with the value of every top-level ``"model"`` key replaced by ``model``, byte for
    byte identical elsewhere. ``raw`` must be a valid JSON object (``parse_request`` accepted
    it); ``MissingModel`` if it has no top-level model, ``MalformedRequest`` if it holds more
    than ``MAX_MODEL_KEYS`` "model" keys. ``spans`` from ``model_spans`` saves the scan."""
    if spans is None:
        spans = _model_values(raw, thorough=True)
    if not spans:
        raise MissingModel('request body has no top-level "model"')
    value = orjson.dumps(model)
    pieces: list[bytes] = []
    done = 0
    for start, end in spans:
        pieces += (raw[done:start], value)
        done = end
    pieces.append(raw[done:])
    return b"".join(pieces)


def _model_values(raw: bytes, thorough: bool) -> list[tuple[int, int]]:
    """(start, end) of the value of every top-level "model" key, in order."""
    keys = [m for m in _candidates(raw, thorough) if _unescaped(raw, m.start())]
    middle = len(raw) // 2
    left = [m for m in keys if m.start() < middle]
    right = [m for m in keys if m.start() >= middle]
    top: list[re.Match[bytes]] = []
    depth, done = 0, 0
    for m in left:  # a key's depth: the brackets opened minus closed before it
        depth += _balance(raw[done : m.start()])
        done = m.start()
        if depth == 1:
            top.append(m)
    tail: list[re.Match[bytes]] = []
    depth, done = 0, len(raw)
    for m in reversed(right):  # or, as a JSON body balances, the closed minus opened after it
        depth -= _balance(raw[m.start() : done])
        done = m.start()
        if depth == 1:
            tail.append(m)
    return [(m.end(), _value_end(raw, m.end())) for m in top + tail[::-1]]


def _last_value(raw: bytes) -> list[tuple[int, int]]:
    """The value of the last plain top-level "model" key. Its depth is counted over the
    shorter side: a key in the second half searched backwards from the end (the brackets
    closed minus opened after it), one in the first half — Claude Code and most hand-written
    bodies put the model first — forwards from the start (opened minus closed before it)."""
    middle = len(raw) // 2
    depth, done = 0, len(raw)
    end = len(raw)
    while (at := raw.rfind(b'"model"', middle, end)) >= 0:
        end = at
        key = _KEY.match(raw, at)
        if key is None or not _unescaped(raw, at):
            continue
        depth -= _balance(raw[at:done])
        done = at
        if depth == 1:
            return [(key.end(), _value_end(raw, key.end()))]
    last: re.Match[bytes] | None = None
    depth, done, seen = 0, 0, 0
    at = raw.find(b'"model"')
    while 0 <= at < middle and seen <= MAX_MODEL_KEYS:
        key = _KEY.match(raw, at)
        if key is not None and _unescaped(raw, at):
            seen += 1
            depth += _balance(raw[done:at])
            done = at
            if depth == 1:
                last = key
        at = raw.find(b'"model"', at + 7)
    if last is None or seen > MAX_MODEL_KEYS:
        return []
    return [(last.end(), _value_end(raw, last.end()))]


def _candidates(raw: bytes, thorough: bool) -> list[re.Match[bytes]]:
    """``_KEY`` matches (see ``model_spans`` for what ``thorough`` searches)."""
    found: list[re.Match[bytes]] = []
    if not (thorough and b"\\u006" in raw):
        start = raw.find(b'"model"')
        while start >= 0 and len(found) <= MAX_MODEL_KEYS:
            if key := _KEY.match(raw, start):
                found.append(key)
            start = raw.find(b'"model"', start + 7)
    if not found and b"\\u006" in raw:
        found = list(itertools.islice(_KEY.finditer(raw), MAX_MODEL_KEYS + 1))
    if len(found) > MAX_MODEL_KEYS:
        raise MalformedRequest(f'request body has more than {MAX_MODEL_KEYS} "model" keys')
    return found


def _unescaped(raw: bytes, quote: int) -> bool:
    """Whether the quote at ``quote`` is a real one: an even run of backslashes before it."""
    start = quote
    while start and raw[start - 1] == 0x5C:
        start -= 1
    return (quote - start) % 2 == 0


def _balance(segment: bytes) -> int:
    """Brackets opened minus closed outside strings, in a segment that starts and ends outside
    strings. Once escaped backslashes and quotes are gone, every quote is real: the even pieces
    between quotes are what lies outside strings."""
    plain = segment.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(plain.split(b'"')[::2])
    return outside.count(b"{") + outside.count(b"[") - outside.count(b"}") - outside.count(b"]")


def _value_end(raw: bytes, start: int) -> int:
    """The end of the JSON value at ``start``: a string or a scalar (the model), or a container
    (a duplicate key's odd value: walked bracket by bracket, the rare case)."""
    first = raw[start : start + 1]
    pattern = _STRING if first == b'"' else None if first in (b"{", b"[") else _SCALAR
    if pattern is not None:
        match = pattern.match(raw, start)
        if match is None:
            raise MalformedRequest('request body has a malformed "model" value')
        return match.end()
    depth = 0
    pos = start
    while bracket := _TO_BRACKET.match(raw, pos):
        pos = bracket.end()
        depth += 1 if raw[pos - 1] in b"[{" else -1
        if depth == 0:
            return pos
    raise MalformedRequest('request body has a malformed "model" value')
