"""Generated bodies and answers for the property tests, driven by a seeded ``random.Random``.

Hypothesis draws the seed (``st.randoms(use_true_random=True)``), so every example replays from
what it reports; building the JSON with plain ``random`` costs a few microseconds where
structured strategies cost milliseconds, which is what lets 10,000 examples run in seconds.
Bodies come two ways: JSON text built piece by piece (duplicate keys, any escapes, huge
integers, deep nesting, odd whitespace), and API-shaped objects whose every field may hold a
value of the wrong type.
"""

from __future__ import annotations

import json
from random import Random
from typing import Any

import orjson

from tests.apis.bodies import nested

WHITESPACE = (b"", b"", b" ", b"\n", b"\t ", b"\r\n  ")
WORDS = ("model", "Model", "mode", '"model"', 'say "model', "\\", '\\"', "{[", "]}", "", "é€😀",
         "tool_call_id", "\u2028", "\x00")
ALPHABET = '"\\{}[]:, modelé€😀\n'


def _escape_all(text: str) -> bytes:
    """Every BMP character as a ``\\u`` escape: "model" spelled without a plain letter."""
    return ('"' + "".join(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else c for c in text) + '"'
            ).encode()


STYLES = (orjson.dumps, lambda s: json.dumps(s).encode(), _escape_all)


class JsonText:
    """JSON values as text, with a known top-level object: ``members`` are (key, value) pieces."""

    def __init__(self, r: Random) -> None:
        self.r = r

    def ws(self) -> bytes:
        return self.r.choice(WHITESPACE)

    def text(self) -> str:
        r = self.r
        if r.random() < 0.5:
            return r.choice(WORDS)
        return "".join(r.choice(ALPHABET) for _ in range(r.randrange(6)))

    def string(self, text: str | None = None) -> bytes:
        return self.r.choice(STYLES)(self.text() if text is None else text)

    def key(self) -> bytes:
        return self.string("model") if self.r.random() < 0.3 else self.string()

    def scalar(self) -> bytes:
        r = self.r
        kind = r.randrange(5)
        if kind == 0:
            return str(r.randint(-(2**200), 2**200) if r.random() < 0.3 else r.randint(-9, 99)
                       ).encode()
        if kind == 1:
            return r.choice((b"true", b"false", b"null", b"-0.0e-0", b"1E+2", b"3.14"))
        return self.string()

    def value(self, depth: int = 0) -> bytes:
        r = self.r
        kind = r.randrange(10) if depth < 4 else 9
        if kind < 2:
            members = [self.member(depth + 1) for _ in range(r.randrange(4))]
            return b"{" + b",".join(members) + b"}"
        if kind < 4:
            items = [self.ws() + self.value(depth + 1) + self.ws() for _ in range(r.randrange(4))]
            return b"[" + b",".join(items) + b"]"
        if kind == 4 and r.random() < 0.2:
            return nested(r.randrange(250, 1000), self.scalar())
        return self.scalar()

    def member(self, depth: int = 0, key: bytes | None = None) -> bytes:
        key = self.key() if key is None else key
        return self.ws() + key + self.ws() + b":" + self.ws() + self.value(depth) + self.ws()

    def members(self) -> list[tuple[bytes, bytes]]:
        """Top-level (key, value) pairs; duplicates and nested "model" keys are common."""
        return [(self.key(), self.value(1)) for _ in range(self.r.randrange(7))]


def join(members: list[tuple[bytes, bytes]], r: Random) -> bytes:
    ws = WHITESPACE
    parts = [r.choice(ws) + k + r.choice(ws) + b":" + r.choice(ws) + v for k, v in members]
    return b"{" + b",".join(parts) + r.choice(ws) + b"}"


# -- API-shaped bodies: right fields, any types ----------------------------------------------

ROLES = ("user", "assistant", "tool", "system", "developer", "function")
BLOCKS = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image",
          "input_text", "output_text")
ITEMS = ("message", "function_call", "function_call_output", "custom_tool_call",
         "custom_tool_call_output", "reasoning", "web_search_call", "computer_call_output",
         "item_reference")


class Shapes:
    """Bodies and answers of the four APIs where any field may be missing or of a wrong type."""

    def __init__(self, r: Random) -> None:
        self.r = r

    def odd(self) -> Any:
        r = self.r
        return r.choice((None, True, False, 0, -1, 2**63 - 1, 1.5, "", "x", [], ["x"], {},
                         {"id": "x"}, [{"type": "text"}]))

    def maybe(self, value: Any) -> Any:
        return value if self.r.random() < 0.8 else self.odd()

    def ident(self) -> Any:
        r = self.r
        return self.maybe(f"id_{r.randrange(4)}" if r.random() < 0.9 else "")

    def text(self) -> Any:
        r = self.r
        if r.random() < 0.5:
            return self.maybe(r.choice(WORDS) * r.randrange(3))
        return [self.block() for _ in range(r.randrange(3))]

    def block(self) -> Any:
        r = self.r
        block = {"type": self.maybe(r.choice(BLOCKS)), "text": self.maybe("some text"),
                 "id": self.ident(), "tool_use_id": self.ident(), "name": self.maybe("bash"),
                 "input": self.maybe({"cmd": "ls"}), "signature": self.maybe("sig"),
                 "data": self.maybe("blob"), "thinking": self.maybe("hm")}
        if r.random() < 0.3:
            block["content"] = self.text()
        return self.maybe(self.prune(block))

    def prune(self, obj: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in obj.items() if self.r.random() < 0.7}

    def call(self) -> Any:
        arguments = self.maybe(self.r.choice(('{"path": "a"}', "not json", "[1, 2]", "")))
        function = self.maybe(self.prune({"name": self.maybe("grep"), "arguments": arguments}))
        return self.maybe(self.prune({"id": self.ident(), "type": "function",
                                      "function": function}))

    def message(self) -> Any:
        r = self.r
        message = {"role": self.maybe(r.choice(ROLES)), "content": self.text(),
                   "tool_calls": self.maybe([self.call() for _ in range(r.randrange(3))]),
                   "tool_call_id": self.ident(), "prefix": self.maybe(True)}
        return self.prune(message) if r.random() < 0.97 else self.odd()

    def item(self) -> Any:
        r = self.r
        item = {"type": self.maybe(r.choice(ITEMS)), "role": self.maybe(r.choice(ROLES)),
                "content": self.text(), "call_id": self.ident(), "name": self.maybe("run"),
                "arguments": self.maybe('{"a": 1}'), "output": self.text(),
                "encrypted_content": self.maybe("enc"), "summary": self.text()}
        return self.prune(item) if r.random() < 0.97 else self.odd()

    def request(self, api_index: int) -> dict[str, Any]:
        """A body with entries of the API ``api_index`` (0 chat, 1 responses, 2 messages,
        3 completions); the fields that decide whether it parses are odd less often than the
        rest."""
        r = self.r
        entries = [self.item() if api_index == 1 else self.message()
                   for _ in range(r.randrange(1, 8))]
        body = self.prune({
            "stream": r.choice((True, False, None, True, False, "false")),
            "tools": self.maybe([self.maybe({"type": "function", "function": self.maybe(
                {"name": self.maybe("grep"), "parameters": {"type": "object"}})})]),
            "system": self.text(), "instructions": self.text(),
            "prompt_cache_key": self.ident(), "metadata": self.maybe({"user_id": self.ident()}),
            "continue_final_message": self.maybe(True),
        })
        body["model"] = "auto" if r.random() < 0.9 else self.odd()
        body["messages" if api_index != 1 else "input"] = (
            entries if r.random() < 0.9 else self.maybe("hello"))
        if r.random() < 0.3:
            body["previous_response_id"] = self.ident()
        if api_index == 3:
            body["prompt"] = self.prompt()
        return body

    def prompt(self) -> Any:
        """A completion's prompt: text, texts, token ids, or lists of them, any odd."""
        r = self.r
        ids = [self.maybe(r.randrange(50_000)) for _ in range(r.randrange(4))]
        return r.choice((self.maybe(r.choice(WORDS) * r.randrange(3)),
                         [self.maybe("some text") for _ in range(r.randrange(3))], ids,
                         [ids, self.maybe(ids)]))

    def answer(self, api_index: int) -> dict[str, Any]:
        """A whole answer or one stream event of any of the four APIs, any field odd."""
        r = self.r
        usage = self.maybe({"prompt_tokens": self.maybe(5), "input_tokens": self.maybe(5),
                            "completion_tokens": self.maybe(2), "output_tokens": self.maybe(2),
                            "prompt_tokens_details": self.maybe({"cached_tokens": self.odd()}),
                            "cache_read_input_tokens": self.maybe(3)})
        output = [self.maybe(self.item()) for _ in range(r.randrange(3))]
        blocks = [self.block() for _ in range(r.randrange(3))]
        choice = self.maybe({"message": self.maybe({"tool_calls": [self.call()]}),
                             "delta": self.maybe({"tool_calls": [self.call()]}),
                             "text": self.maybe("done"), "finish_reason": self.maybe("stop")})
        answer = {
            "type": r.choice(("response.created", "response.completed", "response.failed",
                              "message_start", "content_block_start", "content_block_delta",
                              "message_delta", "message_stop", None)),
            "id": self.ident(), "model": self.maybe("m"), "status": self.maybe("completed"),
            "choices": self.maybe([choice]), "usage": usage, "output": self.maybe(output),
            "content": self.maybe(blocks), "stop_reason": self.maybe("tool_use"),
            "content_block": self.block(),
            "delta": self.maybe({"type": "signature_delta", "signature": self.ident(),
                                 "stop_reason": self.maybe("end_turn")}),
        }
        answer["response"] = self.maybe(self.prune(dict(answer)))
        answer["message"] = self.maybe(self.prune(dict(answer)))
        return self.prune(answer)
