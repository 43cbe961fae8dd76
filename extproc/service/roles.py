"""The two places the service sits in a Gateway API deployment, as configs of one service.

* The **model router** (``saar serve --config FILE``): SAAR picks the physical model, the reply
  rewrites the body's ``model`` and sets ``routing.model_header``, which the HTTPRoute matches
  to choose that model's InferencePool. Scheduling is usually off there: the pools' pickers
  choose the workers.
* The **endpoint picker** of one InferencePool (``saar serve --config FILE --pool-name MODEL``):
  ``pool_config`` narrows the config to that model. A request naming the model is routed
  directly; one naming a logical model (``auto``) goes through SAAR with this model as its
  only candidate, so it is rewritten to the pool's model and never to another pool's; one
  naming another physical model is a 404 (it reached the wrong pool). Worker scoring, the hard
  pin of an open tool loop to the worker that issued its calls, and admission run inside the
  pool, and a pick is always sent. Its state lives under a key prefix of its own pool
  (``<key_prefix>.pool.<model>``): the pool's replicas share it, while the router's records
  (which model a session is on) and another pool's (which of its workers) never overwrite it.
"""

from __future__ import annotations

import re
from dataclasses import replace

import xxhash

from ..config import Config, ConfigError, Decision, ModelRef

MAX_PREFIX = 64


def pool_config(config: Config, model: str, *, source: str = "--pool-name") -> Config:
    """``config`` as the endpoint picker of ``model``'s pool sees it."""
    if model not in config.models:
        raise ConfigError(f"{source}: {model!r} is not one of the models "
                          f"({', '.join(sorted(config.models))})")
    if not config.scheduling.enabled:
        raise ConfigError(f"{source}: scheduling.enabled is false, but an endpoint picker "
                          "picks workers")
    served = {name for name, m in config.models.items() if name == model or m.base == model}
    """The pool's model and its LoRA adapters (one InferencePool serves a base model's)."""
    decisions = tuple(
        replace(d, modelRefs=tuple(r for r in d.modelRefs if r.model in served))
        for d in config.routing.decisions if any(r.model in served for r in d.modelRefs)
    )
    if config.routing.logical_models and not decisions:
        decisions = (Decision(name="pool", modelRefs=(ModelRef(model=model),)),)
    return replace(
        config,
        models={name: m for name, m in config.models.items() if name in served},
        routing=replace(config.routing, decisions=decisions),
        state=replace(config.state, key_prefix=pool_prefix(config.state.key_prefix, model)),
        scheduling=replace(config.scheduling, pool_name=model),
    )


def pool_prefix(prefix: str, model: str) -> str:
    """The state key prefix of one pool's pickers: readable, within the prefix's 64 chars."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", model).strip("-") or "pool"
    readable = f"{prefix}.pool.{slug}"
    if len(readable) <= MAX_PREFIX:
        return readable
    return f"{prefix[:40]}.pool.{xxhash.xxh3_64_hexdigest(model.encode())[:16]}"
