"""``saar bench peers``: the same workloads through saar and the peers' own routers
(vllm-router, sglang-router; Dynamo's KV router on its backend), each against the same workers,
in interleaved rounds, measured by the same client and the engines' own counters.

The pieces, each a small module: ``workloads`` (the sessions, generated from a seed),
``client`` (streams them and times the first token), ``backends`` (the workers: a context
manager yielding their base URLs, the served model and how to read their prefix-cache
counters), ``routers`` (saar behind Envoy, and each peer in its own environment taken from
PyPI on first use, ``install``), ``procstat`` (CPU and RSS of a router's processes),
``stats`` (percentiles and the per-router figures) and ``run`` (the rounds and the report).
"""
