"""The deterministic policy matrix of the SAAR article, run through the live ``Router``."""
