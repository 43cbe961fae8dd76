"""saar-extproc: session-aware routing of LLM agent traffic as an Envoy external processor.

The public surface is small: load a ``Config``, build a ``Router`` (the sans-IO core the gRPC
adapter, the evaluation matrix and the simulators all drive), and feed it requests and responses.
"""

from .apis import ResponseObserver, parse_request
from .config import Config, ConfigError, load_config, parse_config
from .core.router import Routed, Router
from .core.saar import RoutingDecision, SaarEngine
from .errors import RoutingError
from .types import Action, Api, Phase, RequestSummary, ResponseSummary, SessionIdentity

__all__ = [
    "Action",
    "Api",
    "Config",
    "ConfigError",
    "Phase",
    "RequestSummary",
    "ResponseObserver",
    "ResponseSummary",
    "Routed",
    "Router",
    "RoutingDecision",
    "RoutingError",
    "SaarEngine",
    "SessionIdentity",
    "load_config",
    "parse_config",
    "parse_request",
]
