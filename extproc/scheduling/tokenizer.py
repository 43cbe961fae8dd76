"""The model's own tokenizer and chat template, loaded from local files.

Precise prefix scoring compares the router's token blocks with the blocks a server reports in its
KV events, and a context window is a count of the model's tokens: so the router must see a request
as the server does — the same chat template rendered the same way, the same tokenizer, no hub
download. ``path`` is the model's directory (``tokenizer.json``, and ``tokenizer_config.json``'s
``chat_template`` or a ``chat_template.jinja``) or a bare ``tokenizer.json`` (no template: the
router's own rendering is tokenised instead).

The rendering follows vLLM's (``vllm/entrypoints/chat_utils.py`` and transformers'
``apply_chat_template``, checked against a real vLLM's ``/tokenize``): a sandboxed Jinja
environment with ``trim_blocks`` and ``lstrip_blocks``; ``tojson`` as ``json.dumps`` without
ASCII escapes; message content passed as a list of text parts when the template loops over it,
otherwise joined with newlines; an assistant's tool-call arguments parsed from their JSON string;
each tool as ``{"type", "function": {"name", "description", "parameters", ...}}`` in that order,
null where absent; arguments that are not JSON as an empty object;
the generation prompt added; no special tokens added by the tokenizer (the template wrote them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from ..apis.formats import FORMATS
from ..types import Api, RequestSummary

_LOOPS_OVER_CONTENT = re.compile(r"\{%-?\s*for\s+\w+\s+in\s+[\w.\[\]'\"]*content\b")
"""A template that iterates over message content takes it as a list of parts (vLLM's
``openai`` content format); any other takes a string."""
_MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")


class Tokenizer:
    """A Hugging Face ``tokenizers`` tokenizer, with the model's chat template when it has one."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        directory = path if path.is_dir() else path.parent
        file = directory / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {file}")
        self.path = file
        self._tokenizer = _HFTokenizer.from_file(str(file))
        self._render: Callable[..., str] | None = None
        self._parts = False
        self._specials: dict[str, Any] = {}
        if path.is_dir():
            self._load_template(directory)

    @property
    def templated(self) -> bool:
        """Whether requests are rendered with the model's own chat template."""
        return self._render is not None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``. No special tokens are added: the chat template already
        rendered them into the text, as vLLM does for chat requests."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def prompt_tokens(self, summary: RequestSummary) -> list[int] | None:
        """The token ids the engine computes for this request, or None where the router cannot
        render it as the engine does (no template; an API the engine translates itself; a
        batch of completion prompts, several sequences). A completion's prompt is no template's:
        the ids it sent, or its text tokenised with the special tokens vLLM adds to it."""
        if summary.api is Api.CHAT and self._render is not None:
            return self.encode(self.render_chat(summary.body))
        if summary.api is Api.COMPLETIONS:
            prompts = [e["prompt"] for e in FORMATS[Api.COMPLETIONS].entries(summary.body)]
            if len(prompts) != 1:
                return None
            (prompt,) = prompts  # a string or token ids: the parse saw to it
            if isinstance(prompt, str):
                return self._tokenizer.encode(prompt, add_special_tokens=True).ids
            return list(prompt)
        return None

    def render_chat(self, body: dict[str, Any]) -> str:
        """A Chat Completions body as the model's chat template renders it."""
        assert self._render is not None
        messages = [self._message(m) for m in body.get("messages") or () if isinstance(m, dict)]
        tools = [_tool(t) for t in body.get("tools") or () if isinstance(t, dict)] or None
        extra = body.get("chat_template_kwargs")
        kwargs = dict(extra) if isinstance(extra, dict) else {}
        return self._render(messages=messages, tools=tools, add_generation_prompt=True,
                            **self._specials, **kwargs)

    def _load_template(self, directory: Path) -> None:
        config: dict[str, Any] = {}
        if (directory / "tokenizer_config.json").is_file():
            config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: the default one
            source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        if not source and (directory / "chat_template.jinja").is_file():
            source = (directory / "chat_template.jinja").read_text(encoding="utf-8")
        if not isinstance(source, str) or not source:
            return
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._render = env.from_string(source).render
        self._parts = bool(_LOOPS_OVER_CONTENT.search(source))
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = config.get(name)
            if isinstance(value, dict):
                value = value.get("content")
            self._specials[name] = value if isinstance(value, str) else None

    def _message(self, message: dict[str, Any]) -> dict[str, Any]:
        out = {key: message[key] for key in _MESSAGE_KEYS if key in message}
        content = out.get("content")
        if isinstance(content, list):
            texts = [p.get("text", "") for p in content
                     if isinstance(p, dict) and p.get("type") in ("text", "input_text")]
            out["content"] = ([{"type": "text", "text": t} for t in texts] if self._parts
                              else "\n".join(texts))
        calls = out.get("tool_calls")
        if isinstance(calls, list):
            out["tool_calls"] = [_call(c) for c in calls if isinstance(c, dict)]
        return out


def _call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, dict):
        return call
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {}  # vLLM renders arguments it cannot parse as an empty object
    return {**call, "function": {**function, "arguments": arguments}}


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if not isinstance(function, dict):
        return tool
    ordered = {key: function.get(key) for key in ("name", "description", "parameters")}
    ordered.update((k, v) for k, v in function.items() if k not in ordered)
    return {"type": tool.get("type", "function"), "function": ordered}


def _tojson(value: Any, indent: int | None = None, separators: tuple[str, str] | None = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise ValueError(message)
