"""Worker scheduling inside a model's pool: KV-aware scoring, picking and session-aware admission.

SAAR picks the model; this package picks the worker (a model server) that serves it, in the
Gateway API Inference Extension shape: filters, weighted scorers and a picker, run by one
``Scheduler`` that times and contains each plugin. Around it: the prefix indexes (approximate;
precise with memory tiers and a shared pool, ``kv_events`` / ``shared_pool``), the
session-prefix index and the KV hints admission drives. By default the pick minimises each
worker's predicted time to first token (``predicted``), the scorers breaking its ties.
Everything here is pure and synchronous: the sockets that feed it and deliver its hints are
the service's (``extproc.service``).
"""

from .admission import AdmissionController, AdmissionTick
from .affinity import SessionAffinityScorer
from .cost import DynamoCost
from .filters import HealthyFilter, SubsetFilter
from .kv_hints import KvHint, KvHintEmitter
from .picker import MaxScorePicker
from .predicted import PredictedCost
from .prefix_index import ApproximatePrefixIndex
from .scheduler import Scheduler, from_config
from .scorers import KvUtilizationScorer, PrefixScorer, QueueScorer
from .session_prefix import SessionPrefixIndex
from .sessions import ActiveSessionsScorer
from .signals import Signals, parse_metrics
from .types import (
    Filter,
    Picker,
    PickObserver,
    PrefixIndex,
    ScheduleResult,
    SchedulingRequest,
    Scorer,
    Worker,
)
from .workers import WorkerRegistry, load_workers_file

__all__ = [
    "ActiveSessionsScorer",
    "AdmissionController",
    "AdmissionTick",
    "ApproximatePrefixIndex",
    "DynamoCost",
    "Filter",
    "HealthyFilter",
    "KvHint",
    "KvHintEmitter",
    "KvUtilizationScorer",
    "MaxScorePicker",
    "PickObserver",
    "Picker",
    "PredictedCost",
    "PrefixIndex",
    "PrefixScorer",
    "QueueScorer",
    "ScheduleResult",
    "Scheduler",
    "SchedulingRequest",
    "Scorer",
    "SessionAffinityScorer",
    "SessionPrefixIndex",
    "Signals",
    "SubsetFilter",
    "Worker",
    "WorkerRegistry",
    "from_config",
    "load_workers_file",
    "parse_metrics",
]
