"""The chart rendered offline, the example manifests and the CRDs beside the checkout."""

from __future__ import annotations

import base64
import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

from . import k8s_schema

ROOT = Path(__file__).resolve().parent.parent.parent
CHART = ROOT / "deploy" / "helm" / "saar-extproc"
EXAMPLES = ROOT / "deploy" / "examples"
CRD_DIR = next((p / "shared" / "k8s-crds" for p in ROOT.parents
                if (p / "shared" / "k8s-crds").is_dir()), ROOT.parent / "shared" / "k8s-crds")
"""The shared upstream CRDs, beside the checkout (found from a worktree too)."""
VENDORED_CRDS = Path(__file__).resolve().parent / "crds"
"""The CRDs of the examples' gateway kinds and the chart's options (README there)."""
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


@dataclass
class Provisioned:
    """What the chart's provision Job creates in an empty namespace (its real command, against
    a stand-in API server), and the requests it made."""

    objects: dict[tuple[str, str], dict]
    """(kind, name) → the object."""
    requests: list[tuple[str, str]]
    output: str

    def data(self, kind: str, name: str) -> dict[str, str]:
        obj = self.objects[(kind, name)]
        data = obj.get("data") or {}
        if kind == "Secret":
            return {k: base64.b64decode(v).decode() for k, v in data.items()}
        return dict(data)


def provision_job(manifest: Manifest) -> dict | None:
    jobs = manifest.component("Job", "provision")
    assert len(jobs) <= 1
    return jobs[0] if jobs else None


def run_provision(manifest: Manifest, tmp: Path,
                  existing: list[dict] | None = None) -> Provisioned:
    """Run the render's provision Job command (``saar provision ...``) against a stand-in API
    server holding ``existing`` objects; an empty result when the render has no Job."""
    from extproc.cli import main

    from .fake_api import fake_api

    job = provision_job(manifest)
    with fake_api() as api:
        for obj in existing or []:
            api.put(NAMESPACE, obj)
        output = ""
        if job is not None:
            saar = container(job)
            assert saar["command"] == ["saar"]
            kubeconfig = tmp / "kubeconfig"
            kubeconfig.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "test",
                "clusters": [{"name": "test", "cluster": {"server": api.url}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "t"}}]}))
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert main([*saar["args"], "--kubeconfig", str(kubeconfig)]) == 0
            output = out.getvalue()
        objects = {(o["kind"], o["metadata"]["name"]): o for o in api.objects.values()}
        return Provisioned(objects, list(api.requests), output)
