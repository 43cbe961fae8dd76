"""The chart rendered offline, the example manifests and the CRDs beside the checkout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

from . import k8s_schema

ROOT = Path(__file__).resolve().parent.parent.parent
CHART = ROOT / "deploy" / "helm" / "saar-extproc"
EXAMPLES = ROOT / "deploy" / "examples"
CRD_DIR = ROOT.parent / "shared" / "k8s-crds"
RELEASE = "saar-extproc"
NAMESPACE = "llm"

# Every values set the tests render: the chart's defaults and each ci/*-values.yaml file.
VALUES_FILES: dict[str, Path | None] = {"default": None}
VALUES_FILES.update({p.name.removesuffix("-values.yaml"): p
                     for p in sorted((CHART / "ci").glob("*-values.yaml"))})


@dataclass
class Manifest:
    """The objects of one render, with the lookups the tests need."""

    objects: list[dict]
    notes: str

    def of_kind(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict:
        for obj in self.of_kind(kind):
            if obj["metadata"]["name"] == name:
                return obj
        raise KeyError(f"no {kind} named {name!r} in the render")

    def names(self, kind: str) -> set[str]:
        return {o["metadata"]["name"] for o in self.of_kind(kind)}

    def component(self, kind: str, component: str) -> list[dict]:
        return [o for o in self.of_kind(kind)
                if o["metadata"]["labels"].get("app.kubernetes.io/component") == component]


def values_of(name: str) -> dict[str, Any] | None:
    path = VALUES_FILES[name]
    return None if path is None else yaml.safe_load(path.read_text())


def ci_values(name: str) -> dict[str, Any]:
    """The values of a ci/<name>-values.yaml file."""
    values = values_of(name)
    assert values is not None, name
    return values


def effective_values(values: dict[str, Any] | None) -> dict[str, Any]:
    """The chart's defaults with ``values`` coalesced over them, as an install uses them."""
    with helm_python.Chart.load(CHART) as chart:
        return chart.merge_values(values)


def render_chart(values: dict[str, Any] | None = None, *, release: str = RELEASE,
                 namespace: str = NAMESPACE) -> Manifest:
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=release, namespace=namespace, is_install=True)
    objects: list[dict] = []
    notes = ""
    for template, text in sorted(rendered.items()):
        if template.endswith("NOTES.txt"):
            notes = text
            continue
        objects += k8s_schema.load_documents(text)
    return Manifest(objects, notes)


def example_objects() -> dict[str, list[dict]]:
    return {p.name: k8s_schema.load_documents(p.read_text())
            for p in sorted(EXAMPLES.glob("*.yaml"))}


def service_config(manifest: Manifest, configmap: str) -> dict[str, Any]:
    """The saar config a ConfigMap of the render carries."""
    return yaml.safe_load(manifest.get("ConfigMap", configmap)["data"]["config.yaml"])


def container(deployment: dict, name: str | None = None) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
