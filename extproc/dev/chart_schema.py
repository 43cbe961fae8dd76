"""The Helm chart's values schema for the keys that become the service's config, generated
from the service's own config model (``extproc.config``), so the chart refuses at install
what the pods would refuse at start (``config: {limts: ...}`` fails ``helm install``, not
the rollout).

The generated parts of ``deploy/helm/saar-extproc/values.schema.json``: the definitions
``saar.*`` (one per config class, unknown keys refused) and the values that reference them —
``config``, ``router.config``, ``epp.config``, ``epp.scheduling``, ``models[].pricing`` /
``quality`` / ``context_window`` / ``config`` (a model's keys but ``cluster``, which the chart
sets), ``routing.modelHeader`` / ``logicalModels`` / ``decisions``, ``logging.level`` /
``format``. Keys the chart writes itself (``CHART_OWNED``, ``OWNED_INSIDE``) are refused there.
The rest of the file (Kubernetes-side values) is written by hand and left as it is.

    python -m extproc.dev.chart_schema           # rewrite the file
    python -m extproc.dev.chart_schema --check   # exit 1 when the file is stale
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from ..config import Config

SCHEMA_FILE = (Path(__file__).resolve().parents[2] / "deploy" / "helm" / "saar-extproc"
               / "values.schema.json")
PREFIX = "saar."
CHART_OWNED = ("server", "state", "admin", "models", "routing")
"""Top-level config sections the chart renders from its own values."""
OWNED_INSIDE = {"identity": ("tenant_secret_file",), "scheduling": ("discovery", "pool_name"),
                "logging": ("level", "format")}
"""Keys inside a section the chart renders (the tenant secret's mount, each picker's pool, the
log values)."""
MODEL_OWNED = ("cluster",)
"""Keys of a model's entry the chart sets (the Envoy cluster is the model's name)."""


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/definitions/{PREFIX}{name}"}


def config_definitions() -> dict[str, dict[str, Any]]:
    """Every config class's JSON schema, keyed ``saar.<Class>``, without pydantic's titles."""
    schema = TypeAdapter(Config).json_schema(ref_template=f"#/definitions/{PREFIX}{{model}}")
    defs = schema.pop("$defs")
    defs["Config"] = schema
    return {f"{PREFIX}{name}": _untitled(body) for name, body in sorted(defs.items())}


def _untitled(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _untitled(v) for k, v in node.items()
                if not (k == "title" and isinstance(v, str))}
    if isinstance(node, list):
        return [_untitled(v) for v in node]
    return node


def _without(section: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """A section's schema with ``keys`` refused (the chart sets them)."""
    return {"allOf": [_ref(section), {"properties": dict.fromkeys(keys, False)}]}


def _model_entry(model: dict[str, Any]) -> dict[str, Any]:
    """A model's entry without the keys the chart sets: not required, refused if given."""
    entry = copy.deepcopy(model)
    for key in MODEL_OWNED:
        entry["properties"].pop(key, None)
    required = [k for k in entry.get("required", ()) if k not in MODEL_OWNED]
    if required:
        entry["required"] = required
    else:
        entry.pop("required", None)
    entry["additionalProperties"] = False
    return entry


def _service_config(defs: dict[str, dict[str, Any]], description: str) -> dict[str, Any]:
    """Keys of the service's config a values set may add: any section the chart does not own."""
    config = defs[f"{PREFIX}Config"]
    sections: dict[str, Any] = {}
    for name, sub in config["properties"].items():
        if name in CHART_OWNED:
            sections[name] = False
        elif name in OWNED_INSIDE:
            sections[name] = _without(sub["$ref"].rsplit(".", 1)[-1], OWNED_INSIDE[name])
        else:
            sections[name] = sub
    return {"type": "object", "description": description, "additionalProperties": False,
            "properties": sections}


def generate(values_schema: dict[str, Any]) -> dict[str, Any]:
    """``values_schema`` with its config-derived parts regenerated."""
    out = copy.deepcopy(values_schema)
    defs = config_definitions()
    model = defs[f"{PREFIX}Model"]
    routing = defs[f"{PREFIX}Routing"]["properties"]
    out["definitions"] = {k: v for k, v in out.get("definitions", {}).items()
                          if not k.startswith(PREFIX)} | defs
    props = out["properties"]
    props["config"] = _service_config(
        defs, "More keys of the service config, for both roles (extproc.config: unknown keys "
        "fail). The chart owns " + ", ".join(CHART_OWNED) + ", identity.tenant_secret_file "
        "and scheduling.discovery / pool_name.")
    for role in ("router", "epp"):
        props[role]["properties"]["config"] = _service_config(
            defs, "Keys merged into this role's service config only.")
    props["epp"]["properties"]["scheduling"] = {
        **_without("Scheduling", OWNED_INSIDE["scheduling"]),
        "description": "Merged into the pickers' `scheduling` (scorers, admission, prefix...)."}
    entry = props["models"]["items"]["properties"]
    entry["pricing"] = _ref("Pricing")
    entry["quality"] = model["properties"]["quality"]
    entry["context_window"] = model["properties"]["context_window"]
    entry["config"] = {**_model_entry(model),
                       "description": "More keys of this model's entry in the service config "
                       "(" + ", ".join(MODEL_OWNED) + ": the chart's)."}
    logging = defs.get(f"{PREFIX}Logging")
    if logging is not None:
        for key in OWNED_INSIDE["logging"]:
            props["logging"]["properties"][key] = logging["properties"][key]
    routes = props["routing"]["properties"]
    routes["modelHeader"] = routing["model_header"]
    routes["logicalModels"] = routing["logical_models"]
    routes["decisions"] = {"type": "array", "minItems": 1, "items": _ref("Decision")}
    return out


def render(values_schema: dict[str, Any]) -> str:
    return json.dumps(generate(values_schema), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m extproc.dev.chart_schema",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the file differs from what would be written")
    parser.add_argument("--file", type=Path, default=SCHEMA_FILE,
                        help=f"the values schema (default {SCHEMA_FILE})")
    args = parser.parse_args(argv)
    current = args.file.read_text()
    wanted = render(json.loads(current))
    if args.check:
        if current != wanted:
            print(f"{args.file} is stale: run python -m extproc.dev.chart_schema",
                  file=sys.stderr)
            return 1
        return 0
    args.file.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
