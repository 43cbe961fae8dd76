from __future__ import annotations

import importlib

import extproc.scheduling as scheduling


def test_the_public_surface_is_pinned() -> None:
    assert sorted(scheduling.__all__) == [
        "ActiveSessionsScorer", "AdmissionController", "AdmissionTick", "ApproximatePrefixIndex",
        "DynamoCost", "Filter",
        "HealthyFilter", "KvHint", "KvHintEmitter", "KvUtilizationScorer", "MaxScorePicker",
        "PickObserver", "Picker", "PredictedCost", "PrefixIndex", "PrefixScorer", "QueueScorer",
        "ScheduleResult",
        "Scheduler", "SchedulingRequest", "Scorer", "SessionAffinityScorer",
        "SessionPrefixIndex", "Signals", "SubsetFilter",
        "Worker", "WorkerRegistry", "from_config", "load_workers_file", "parse_metrics",
    ]


def test_the_core_imports_neither_grpc_nor_asyncio() -> None:
    for name in ("admission", "affinity", "cost", "filters", "kv_hints", "picker",
                 "pacing", "predicted", "prefix_index", "rates", "scheduler", "scorers",
                 "session_prefix", "sessions",
                 "shared_pool", "signals", "types", "workers"):
        module = importlib.import_module(f"extproc.scheduling.{name}")
        source = open(module.__file__ or "").read()  # noqa: SIM115
        assert "import asyncio" not in source and "grpc" not in source, name
