"""Worker scheduling inside a model's pool: KV-aware scoring, picking and session-aware admission.

SAAR picks the model; this package picks the worker (a model server) that serves it, in the
Gateway API Inference Extension shape: filters, weighted scorers and a picker, run by one
``Scheduler`` that times and contains each plugin. Everything here is pure and synchronous.
"""
