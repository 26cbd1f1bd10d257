"""Derive tests/schemas/agones-fleet.schema.json and agones-fleetautoscaler.schema.json from the
CRDs of a released Agones version.

    git --git-dir=<agones clone>/.git show v1.41.0:install/yaml/install.yaml > install.yaml
    python tools/agones_schemas.py install.yaml 1.41.0 tests/schemas

Agones publishes its CRDs rendered in install/yaml/install.yaml. Each CRD's openAPIV3Schema
becomes a JSON Schema (draft 2020-12):

* descriptions, defaults and formats go; ``nullable`` becomes a null type; OpenAPI's boolean
  ``exclusiveMinimum`` becomes the JSON Schema number;
* every object with ``properties`` (and no ``x-kubernetes-preserve-unknown-fields``) refuses
  other keys, as the API server does under strict field validation (``kubectl apply
  --validate=strict``): a field an older Agones does not know fails;
* the Pod template inside the GameServer template is left open: tests/deploy validates it
  against the Kubernetes schemas (kubernetes-validate);
* apiVersion, kind and metadata.name are added (the CRD leaves them to the API server).

The version is recorded in the schema (``x-agones-version``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

KINDS = {"Fleet": ("agones.dev/v1", "agones-fleet.schema.json"),
         "FleetAutoscaler": ("autoscaling.agones.dev/v1", "agones-fleetautoscaler.schema.json")}
DROPPED = {"description", "default", "format", "x-kubernetes-int-or-string",
           "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type",
           "x-kubernetes-embedded-resource", "x-kubernetes-preserve-unknown-fields", "nullable",
           "title", "example"}


def convert(node: Any, path: tuple[str, ...] = ()) -> Any:
    if isinstance(node, list):
        return [convert(item, path) for item in node]
    if not isinstance(node, dict):
        return node
    if path[-4:] == ("spec", "template", "spec", "template") and path[:2] == ("spec", "template"):
        return {"type": "object"}       # the Pod template: checked by kubernetes-validate
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in DROPPED:
            continue
        if key == "properties":
            out[key] = {name: convert(sub, path + (name,)) for name, sub in value.items()}
        elif key == "additionalProperties" and isinstance(value, dict):
            out[key] = convert(value, path + ("*",))
        elif key == "items":
            out[key] = convert(value, path + ("[]",))
        elif key == "exclusiveMinimum" and value is True:
            out["exclusiveMinimum"] = node["minimum"]
        else:
            out[key] = convert(value, path)
    if out.get("exclusiveMinimum") is not None and "minimum" in out and \
            node.get("exclusiveMinimum") is True:
        del out["minimum"]
    if "properties" in out and not node.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def derive(install: str, version: str) -> dict[str, dict]:
    schemas = {}
    for document in yaml.safe_load_all(install):
        if not document or document.get("kind") != "CustomResourceDefinition":
            continue
        kind = document["spec"]["names"]["kind"]
        if kind not in KINDS:
            continue
        api_version, filename = KINDS[kind]
        (served,) = [v for v in document["spec"]["versions"] if v.get("storage")]
        schema = convert(served["schema"]["openAPIV3Schema"])
        schema["properties"].pop("status", None)
        schema["properties"]["apiVersion"] = {"const": api_version}
        schema["properties"]["kind"] = {"const": kind}
        schema["properties"]["metadata"] = {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 63,
                                    "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                           "namespace": {"type": "string"},
                           "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                           "annotations": {"type": "object",
                                           "additionalProperties": {"type": "string"}}}}
        schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
        schemas[filename] = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"Agones {kind} ({api_version}), Agones {version}",
            "$comment": f"Derived by tools/agones_schemas.py from the {kind} CRD in Agones "
                        f"v{version} install/yaml/install.yaml (googleforgames/agones). Do not "
                        "edit: regenerate.",
            "x-agones-version": version,
            **schema,
        }
    missing = {filename for _, filename in KINDS.values()} - set(schemas)
    if missing:
        raise SystemExit(f"no CRD for {sorted(missing)} in the install.yaml given")
    return schemas


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    install, version, out = argv
    for filename, schema in derive(Path(install).read_text(), version).items():
        (Path(out) / filename).write_text(json.dumps(schema, indent=1, sort_keys=False) + "\n")
        print(f"wrote {Path(out) / filename}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
