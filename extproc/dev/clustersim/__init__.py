"""A discrete-event simulation of a worker pool serving agentic sessions.

It runs the same scheduling objects as the server (``extproc.scheduling``: the ``Scheduler``
and session-aware ``Admission``) against simulated vLLM-like workers in virtual time, so routing
and admission policies can be compared on minutes of agent traffic in seconds of CPU. Each worker
keeps KV in memory tiers (device, host memory, optionally disk: ``tiers``) and takes the
router's KV hints (``extproc.scheduling.kv_hints``: share, prefetch, demote, release).
"""
