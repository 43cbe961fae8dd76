"""Offline validation of Kubernetes objects, as close to the API server as a test can get.

* Core kinds: ``kubernetes-validate`` (the Kubernetes OpenAPI schemas, strict: unknown fields
  fail) plus the name and label syntax the schemas leave to the server's Go code.
* Custom resources: the CRD's ``openAPIV3Schema`` after the server's structural defaulting,
  strict (an object node that does not preserve unknown fields rejects them, as
  ``kubectl apply --validate=strict`` does), the ``x-kubernetes-list-type`` set / map
  uniqueness, and every ``x-kubernetes-validations`` CEL rule, evaluated with cel-python on
  each node the object has, with the server's property-name escaping (``__namespace__``).

Kubernetes' CEL environment adds libraries to standard CEL; of those, the rules in the CRDs
we validate against use only ``split`` (strings extension), implemented here with
``lowerAscii`` / ``upperAscii``.
``unsupported_functions`` names any other function a rule calls, so that a new rule that
this evaluator cannot run fails a test instead of being skipped. Transition rules (those that
read ``oldSelf``) do not run on create, so they are counted in ``ValidationReport.skipped``,
never evaluated. The server's CEL cost budget is not estimated.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import yaml
from celpy import celtypes
from celpy.evaluation import CELEvalError

K8S_VERSION = "1.37.0"

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

# Kinds whose name the server checks as a DNS-1035 label (Services) or DNS-1123 label.
DNS1035_KINDS = {"Service"}
DNS1123_LABEL_KINDS = {"Namespace"}


# --- names, labels, annotations -------------------------------------------------------------

def _qualified_key_errors(key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    errors = []
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        errors.append(f"key {key!r}: prefix is not a DNS subdomain")
    if not name or len(name) > 63 or not QUALIFIED_NAME.match(name):
        errors.append(f"key {key!r}: name part is not a qualified name")
    return errors


def metadata_errors(obj: dict) -> list[str]:
    """What the API server's ObjectMeta validation would reject."""
    meta = obj.get("metadata") or {}
    kind = obj.get("kind", "?")
    name = meta.get("name", "")
    errors = []
    if kind in DNS1035_KINDS:
        if len(name) > 63 or not DNS1035_LABEL.match(name):
            errors.append(f"metadata.name {name!r}: a {kind} name must be a DNS-1035 label")
    elif kind in DNS1123_LABEL_KINDS:
        if len(name) > 63 or not DNS1123_LABEL.match(name):
            errors.append(f"metadata.name {name!r}: must be a DNS-1123 label")
    elif len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        errors.append(f"metadata.name {name!r}: must be a DNS-1123 subdomain")
    namespace = meta.get("namespace")
    if namespace is not None and (len(namespace) > 63 or not DNS1123_LABEL.match(namespace)):
        errors.append(f"metadata.namespace {namespace!r}: must be a DNS-1123 label")
    for key, value in (meta.get("labels") or {}).items():
        errors += [f"metadata.labels: {e}" for e in _qualified_key_errors(key)]
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            errors.append(f"metadata.labels[{key!r}]: {value!r} is not a valid label value")
    for key, value in (meta.get("annotations") or {}).items():
        errors += [f"metadata.annotations: {e}" for e in _qualified_key_errors(key)]
        if not isinstance(value, str):
            errors.append(f"metadata.annotations[{key!r}]: must be a string")
    return errors


def label_selector_errors(where: str, labels: dict) -> list[str]:
    errors = []
    for key, value in labels.items():
        errors += [f"{where}: {e}" for e in _qualified_key_errors(key)]
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            errors.append(f"{where}[{key!r}]: {value!r} is not a valid label value")
    return errors


def core_errors(obj: dict, version: str = K8S_VERSION) -> list[str]:
    """A core kind against the bundled Kubernetes schema (strict), plus its metadata."""
    errors = metadata_errors(obj)
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        errors.append(f"{path or '<root>'}: {exc.message}")
    return errors


def is_core(obj: dict, version: str = K8S_VERSION) -> bool:
    """Whether kubernetes-validate bundles a schema for this kind."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return False
    except kubernetes_validate.ValidationError:
        return True
    return True


# --- CEL ------------------------------------------------------------------------------------

# apiserver/pkg/cel: property names that are CEL keywords are escaped as __name__.
CEL_RESERVED = frozenset({
    "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for",
    "function", "if", "import", "let", "loop", "package", "namespace", "return", "var",
    "void", "while",
})
_ESCAPABLE = re.compile(r"^[a-zA-Z_.\-/][a-zA-Z0-9_.\-/]*$")


def escape_property(name: str) -> str | None:
    """A property name as CEL sees it, or None when CEL cannot reach it."""
    if name in CEL_RESERVED:
        return f"__{name}__"
    if not _ESCAPABLE.match(name):
        return None
    return (name.replace("__", "__underscores__").replace(".", "__dot__")
            .replace("-", "__dash__").replace("/", "__slash__"))


def _cel_split(text: Any, separator: Any, limit: Any = None) -> celtypes.ListType:
    """Kubernetes' strings extension: ``'a/b'.split('/')`` and ``split(sep, n)``."""
    if not isinstance(text, str) or not isinstance(separator, str):
        raise TypeError(f"split: no overload for {type(text).__name__}, {type(separator).__name__}")
    if limit is None or int(limit) < 0:
        parts = text.split(separator) if separator else list(text)
    elif int(limit) == 0:
        parts = []
    else:
        parts = text.split(separator, int(limit) - 1)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _cel_ascii_case(upper: bool) -> Any:
    def convert(text: Any) -> celtypes.StringType:
        if not isinstance(text, str):
            raise TypeError(f"no overload for {type(text).__name__}")
        table = str.maketrans(*(("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
                                [::1 if upper else -1]))
        return celtypes.StringType(text.translate(table))
    return convert


EXTENSION_FUNCTIONS = {"split": _cel_split, "lowerAscii": _cel_ascii_case(False),
                       "upperAscii": _cel_ascii_case(True)}

# Functions and macros that cel-python's standard environment provides.
STANDARD_FUNCTIONS = frozenset({
    "has", "all", "exists", "exists_one", "map", "filter", "size", "matches", "startsWith",
    "endsWith", "contains", "duration", "timestamp", "int", "uint", "double", "string",
    "bool", "bytes", "type", "dyn",
})
SUPPORTED_FUNCTIONS = STANDARD_FUNCTIONS | set(EXTENSION_FUNCTIONS)

_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_STRING = re.compile(r'r?"""(?:.|\n)*?"""|r?\'\'\'(?:.|\n)*?\'\'\'|r?"(?:\\.|[^"\\])*"|'
                     r"r?'(?:\\.|[^'\\])*'")


def called_functions(rule: str) -> set[str]:
    """The names a rule calls (string literals removed first: their text is not code)."""
    return set(_CALL.findall(_STRING.sub('""', rule)))


def unsupported_functions(rule: str) -> set[str]:
    return called_functions(rule) - SUPPORTED_FUNCTIONS


_ENV = celpy.Environment()


@cache
def compile_rule(rule: str) -> Any:
    """A runnable program for a rule (raises celpy.CELParseError on a syntax error)."""
    return _ENV.program(_ENV.compile(rule), functions=EXTENSION_FUNCTIONS)


def to_cel(value: Any, schema: dict | None) -> Any:
    """Convert data to CEL values the way the server types it from the structural schema."""
    schema = schema or {}
    if value is None:
        return None
    if isinstance(value, dict):
        properties = schema.get("properties")
        if properties is not None:
            out = {}
            for key, item in value.items():
                escaped = escape_property(key)
                if escaped is not None:
                    out[celtypes.StringType(escaped)] = to_cel(item, properties.get(key))
            return celtypes.MapType(out)
        inner = schema.get("additionalProperties")
        inner = inner if isinstance(inner, dict) else None
        return celtypes.MapType({celtypes.StringType(k): to_cel(v, inner)
                                 for k, v in value.items()})
    if isinstance(value, list):
        return celtypes.ListType([to_cel(v, schema.get("items")) for v in value])
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    raise TypeError(f"cannot convert {type(value).__name__} to CEL")


def evaluate_rule(rule: str, value: Any, schema: dict) -> tuple[bool, str | None]:
    """Evaluate one rule with ``self`` bound to ``value``: (passed, error text or None)."""
    try:
        program = compile_rule(rule)
    except celpy.CELParseError as exc:
        return False, f"does not compile: {exc}"
    try:
        result = program.evaluate({"self": to_cel(value, schema)})
    except CELEvalError as exc:
        return False, f"evaluation error: {exc.args[0] if exc.args else exc}"
    if isinstance(result, CELEvalError):
        return False, f"evaluation error: {result.args[0] if result.args else result}"
    if not isinstance(result, celtypes.BoolType):
        return False, f"evaluated to {result!r}, not a bool"
    return bool(result), None


# --- structural schemas ---------------------------------------------------------------------

def _nodes(schema: dict, data: Any, path: str) -> Iterator[tuple[dict, Any, str]]:
    """Every (schema node, data, path) the data has, depth first."""
    yield schema, data, path
    if isinstance(data, dict):
        properties = schema.get("properties")
        if properties is not None:
            for key, item in data.items():
                if key in properties:
                    yield from _nodes(properties[key], item, f"{path}.{key}" if path else key)
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, item in data.items():
                yield from _nodes(schema["additionalProperties"], item, f"{path}[{key!r}]")
    elif isinstance(data, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(data):
            yield from _nodes(schema["items"], item, f"{path}[{i}]")


def apply_defaults(schema: dict, data: Any) -> Any:
    """The API server's structural defaulting: absent properties with a default get it."""
    if isinstance(data, dict):
        properties = schema.get("properties")
        if properties is not None:
            for key, sub in properties.items():
                if key not in data and "default" in sub:
                    data[key] = copy.deepcopy(sub["default"])
            for key, item in data.items():
                if key in properties:
                    apply_defaults(properties[key], item)
        elif isinstance(schema.get("additionalProperties"), dict):
            for item in data.values():
                apply_defaults(schema["additionalProperties"], item)
    elif isinstance(data, list) and isinstance(schema.get("items"), dict):
        for item in data:
            apply_defaults(schema["items"], item)
    return data


def strict_schema(schema: dict) -> dict:
    """The schema with unknown fields rejected wherever the structural schema prunes them."""
    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {k: walk(v) for k, v in node.items()}
        if (node.get("type") == "object" and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    return walk(schema)


def _list_type_errors(schema: dict, data: Any, path: str) -> list[str]:
    list_type = schema.get("x-kubernetes-list-type")
    if not isinstance(data, list) or list_type not in ("set", "map"):
        return []
    seen: set[str] = set()
    errors = []
    for i, item in enumerate(data):
        if list_type == "set":
            key = repr(item)
        else:
            keys = schema.get("x-kubernetes-list-map-keys", [])
            item_schema = schema.get("items", {}).get("properties", {})
            key = repr(tuple(item.get(k, item_schema.get(k, {}).get("default")) for k in keys))
        if key in seen:
            errors.append(f"{path}[{i}]: duplicate entry {key} in a list of type {list_type}")
        seen.add(key)
    return errors


@dataclass
class ValidationReport:
    errors: list[str] = field(default_factory=list)
    rules_evaluated: int = 0
    skipped: list[str] = field(default_factory=list)   # transition rules: not run on create

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class CrdVersion:
    group: str
    version: str
    kind: str
    schema: dict


class CrdValidator:
    """Validates custom resources against the CRDs found in a folder."""

    def __init__(self, crd_files: Iterable[Path]) -> None:
        self.versions: dict[tuple[str, str], CrdVersion] = {}
        self.rules: list[tuple[str, str, str]] = []   # (crd, path, rule)
        for path in crd_files:
            crd = yaml.safe_load(path.read_text())
            spec = crd["spec"]
            for version in spec["versions"]:
                if not version.get("served", False):
                    continue
                schema = version["schema"]["openAPIV3Schema"]
                api_version = f"{spec['group']}/{version['name']}"
                self.versions[(api_version, spec["names"]["kind"])] = CrdVersion(
                    spec["group"], version["name"], spec["names"]["kind"], schema)
                for node_path, rule in _schema_rules(schema, ""):
                    self.rules.append((f"{crd['metadata']['name']}/{version['name']}",
                                       node_path, rule["rule"]))
        self._validators: dict[tuple[str, str], jsonschema.protocols.Validator] = {}

    def knows(self, obj: dict) -> bool:
        return (obj.get("apiVersion"), obj.get("kind")) in self.versions

    def _validator(self, key: tuple[str, str]) -> jsonschema.protocols.Validator:
        if key not in self._validators:
            schema = strict_schema(_with_type_meta(self.versions[key].schema))
            cls = jsonschema.Draft4Validator   # OpenAPI 3.0 schemas are draft-4 shaped
            self._validators[key] = cls(schema, format_checker=cls.FORMAT_CHECKER)
        return self._validators[key]

    def validate(self, obj: dict) -> ValidationReport:
        report = ValidationReport()
        key = (obj.get("apiVersion"), obj.get("kind"))
        if key not in self.versions:
            report.errors.append(f"no served CRD version for {key[0]} {key[1]}")
            return report
        schema = self.versions[key].schema
        data = apply_defaults(schema, copy.deepcopy(obj))
        report.errors += metadata_errors(data)
        for error in sorted(self._validator(key).iter_errors(data), key=lambda e: list(e.path)):
            where = ".".join(str(p) for p in error.absolute_path)
            report.errors.append(f"{where or '<root>'}: {error.message}")
        for node, value, path in _nodes(schema, data, ""):
            report.errors += _list_type_errors(node, value, path or "<root>")
            for rule in node.get("x-kubernetes-validations", []) or []:
                text = rule["rule"]
                if re.search(r"\boldSelf\b", text):
                    report.skipped.append(f"{path or '<root>'}: {text}")
                    continue
                report.rules_evaluated += 1
                passed, problem = evaluate_rule(text, value, node)
                if not passed:
                    message = rule.get("message") or f"failed rule: {text}"
                    detail = f" ({problem})" if problem else ""
                    report.errors.append(f"{path or '<root>'}: {message}{detail}")
        return report


def _with_type_meta(schema: dict) -> dict:
    """The root as the server sees it: apiVersion, kind and metadata are always allowed (a CRD
    may leave them out of its schema, as Istio's do)."""
    schema = copy.deepcopy(schema)
    properties = schema.setdefault("properties", {})
    properties.setdefault("apiVersion", {"type": "string"})
    properties.setdefault("kind", {"type": "string"})
    properties.setdefault("metadata", {"type": "object"})
    return schema


def _schema_rules(schema: Any, path: str) -> Iterator[tuple[str, dict]]:
    if isinstance(schema, dict):
        for rule in schema.get("x-kubernetes-validations", []) or []:
            yield path or "<root>", rule
        for key, value in schema.items():
            if key == "properties" and isinstance(value, dict):
                for name, sub in value.items():
                    yield from _schema_rules(sub, f"{path}.{name}")
            elif key in ("items", "additionalProperties"):
                yield from _schema_rules(value, f"{path}[]")
            elif key in ("allOf", "anyOf", "oneOf") and isinstance(value, list):
                for sub in value:
                    yield from _schema_rules(sub, path)


def load_documents(text: str) -> list[dict]:
    """The non-empty YAML documents of a manifest."""
    return [doc for doc in yaml.safe_load_all(text) if doc]
