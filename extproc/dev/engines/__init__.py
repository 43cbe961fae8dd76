"""Real engines and routers the benches run beside saar, each installed on first use into its own
environment under a cache directory outside the repo."""
