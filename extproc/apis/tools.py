"""The tools a request offers, in every shape the three APIs and their clients send them.

Chat: ``{"type": "function", "function": {"name", "parameters"}}``. Messages: ``{"name",
"input_schema"}`` (server tools: ``{"type": "web_search_20250305", "name"}``). Responses:
``{"type": "function", "name", "parameters"}``, a free-form ``{"type": "custom", "name",
"format"}`` (its input is text, not JSON), a built-in named by its type (``web_search``), and a
``{"type": "namespace", "name", "tools": [...]}`` group whose calls carry ``"namespace"``.
Codex's default request format ("responses-lite") sends no top-level ``tools`` at all: they
arrive as an ``{"type": "additional_tools", "tools": [...]}`` input item, which each API
module's ``tools`` gathers (``formats.ApiFormat.tools``). Nothing here trusts the schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .common import as_dict, as_list

MAX_DEPTH = 4
"""Namespaces nested deeper than this are not walked (no client nests at all beyond one)."""


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool as the model sees it: what it is called, where, and what input it takes."""

    name: str
    namespace: str | None = None
    """The namespace group it was offered in: its calls name it beside ``name``."""
    custom: bool = False
    """Free-form text input (a Responses custom tool), not JSON arguments."""
    schema: dict[str, Any] = field(default_factory=dict, compare=False)
    """The JSON schema of its arguments, as sent (empty for custom and built-in tools)."""
    description: str = field(default="", compare=False)


def offered(definitions: Iterable[Any]) -> tuple[Tool, ...]:
    """Every tool of ``definitions`` (any API's shape), namespaces flattened, in order."""
    return tuple(_walk(definitions, None, 0))


def _walk(definitions: Iterable[Any], namespace: str | None, depth: int) -> Iterator[Tool]:
    for definition in definitions:
        if not isinstance(definition, dict):
            continue
        kind = definition.get("type")
        if kind == "namespace":
            inner = definition.get("name")
            if depth < MAX_DEPTH:
                yield from _walk(as_list(definition.get("tools")),
                                 inner if isinstance(inner, str) and inner else namespace,
                                 depth + 1)
            continue
        function = as_dict(definition.get("function"))
        name = definition.get("name") or function.get("name") or kind
        if not isinstance(name, str) or not name:
            continue
        schema = (definition.get("parameters") or definition.get("input_schema")
                  or function.get("parameters"))
        description = definition.get("description") or function.get("description")
        yield Tool(
            name=name,
            namespace=namespace,
            custom=kind == "custom",
            schema=schema if isinstance(schema, dict) else {},
            description=description if isinstance(description, str) else "",
        )


def names(tools: Iterable[Tool]) -> tuple[str, ...]:
    return tuple(tool.name for tool in tools)
