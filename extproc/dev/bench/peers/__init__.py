"""``saar bench peers``: the same workloads through saar and the peers' own routers
(vllm-router, sglang-router; Dynamo's KV router on its backend), each against the same workers,
in interleaved rounds, measured by the same client and the engines' own counters.

The pieces, each a small module: ``workloads`` (the sessions, generated from a seed),
``client`` (streams them and times the first token), ``backends`` (the workers: a context
manager yielding their base URLs, the served model and how to read their prefix-cache
counters: ``saar sim-server``s or two real vLLM servers; ``dynamo_backend``: Dynamo's mockers
behind its frontend, with Dynamo's KV router and saar naming the worker), ``routers`` (saar
behind Envoy, and each peer in its own environment taken from PyPI on first use,
``install``), ``procstat`` (CPU and RSS of a router's processes), ``precise`` (saar's precise
index against the cached tokens real vLLM reports), ``stats`` (percentiles and the per-router
figures) and ``run`` (the rounds and the report).
"""
