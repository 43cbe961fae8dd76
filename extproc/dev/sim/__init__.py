"""Simulated model servers that behave like vLLM where routing cares."""
