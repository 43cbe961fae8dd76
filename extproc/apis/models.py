"""``GET /v1/models`` as the proxy answers it (Envoy, from the config: no model server is
asked): the logical models clients send (``auto``) and the physical ones, each with its
context window under every name OpenAI-compatible clients read it by — ``max_model_len``
(vLLM's own ``/v1/models``, SGLang), ``context_length`` (OpenRouter's; Open WebUI, opencode,
Continue...) and ``context_window``.

A logical model's window is the longest context every one of its decisions can serve: each
decision routes to the largest window among its models once the context outgrows the others,
so the smallest of those per-decision maxima is what a client can count on whichever
decision its turn matches.
"""

from __future__ import annotations

from typing import Any

from ..config import Config

OWNER = "saar-extproc"
WINDOW_FIELDS = ("max_model_len", "context_length", "context_window")


def context_window(config: Config, name: str) -> int:
    """The window ``name`` (logical or physical) is advertised with."""
    models = config.models
    if name in models:
        return models[name].context_window
    reach = [max(models[ref.model].context_window for ref in d.modelRefs)
             for d in config.routing.decisions]
    return min(reach)


def model_card(config: Config, name: str) -> dict[str, Any]:
    card: dict[str, Any] = {"id": name, "object": "model", "created": 0, "owned_by": OWNER}
    window = context_window(config, name)
    card.update(dict.fromkeys(WINDOW_FIELDS, window))
    return card


def model_names(config: Config) -> tuple[str, ...]:
    """Logical models first (what clients should send), then the physical ones."""
    return (*config.routing.logical_models, *config.models)


def model_list(config: Config) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(config, n) for n in model_names(config)]}
