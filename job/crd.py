"""The `ParallelTrainingJob` CustomResourceDefinition, generated from the spec models of `job.spec`.

    autopar crd > crds/paralleltrainingjobs.autopar.dev.yaml      # what tests/job/test_crd.py checks

pydantic's JSON schema is turned into a Kubernetes *structural* schema (every node typed, no
``$ref``/``anyOf``, ``nullable`` for optional fields, ``x-kubernetes-preserve-unknown-fields``
for free-form maps such as model options).  Defaults, enums and ranges come from the models, so
the API server applies the same defaults as `autopar run --local`.  Rules a schema cannot state
are CEL ``x-kubernetes-validations`` (Kubernetes >= 1.25):

- a pinned plan needs ``planner.planRef``; ``planRef`` names exactly one of configMap and path;
  ``data.source: file`` needs ``data.path`` — the same rules as the models' validators;
- the spec cannot change after creation except ``runPolicy.suspend`` (transition rules
  ``self == oldSelf``), since a plan, a checkpoint and a run all belong to one spec.

Strings, lists and maps carry ``maxLength``/``maxItems``/``maxProperties`` so that the API
server's CEL cost estimate of those rules stays within its budget.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from .spec import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, JobSpec, JobStatus

#: Cross-field rules; each is also a model validator of `job.spec` (tests/job/test_crd.py runs both).
RULES = {
    "planner": [{"rule": "self.algorithm != 'pinned' || has(self.planRef)",
                 "message": "algorithm 'pinned' needs planner.planRef (a configMap or a path holding the plan file)",
                 "fieldPath": ".planRef", "reason": "FieldValueRequired"}],
    "PlanRef": [{"rule": "has(self.configMap) != has(self.path)",
                 "message": "planRef needs exactly one of configMap and path"}],
    "data": [{"rule": "self.source != 'file' || has(self.path)",
              "message": "data.source 'file' needs data.path (the torch.save'd dict of input and label tensors)",
              "fieldPath": ".path", "reason": "FieldValueRequired"}],
}
#: Printer columns of `kubectl get ptj`.
PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Devices", "type": "string", "jsonPath": ".status.devices"},
    {"name": "Simulated", "type": "string", "jsonPath": ".status.simulatedStep",
     "description": "simulated step time of the plan"},
    {"name": "Actual", "type": "string", "jsonPath": ".status.actualStep",
     "description": "median measured step time"},
    {"name": "Speedup", "type": "string", "jsonPath": ".status.predictedSpeedup",
     "description": "simulated speedup of the plan over data parallelism"},
    {"name": "Strategy", "type": "string", "jsonPath": ".status.strategy", "priority": 1},
    {"name": "Error", "type": "number", "jsonPath": ".status.predictionError", "priority": 1,
     "description": "simulated / measured step time - 1"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition as a dict (apiextensions.k8s.io/v1)."""
    spec = structural(JobSpec.model_json_schema(by_alias=True, mode="validation"))
    _section_defaults(spec)
    _immutable_except_suspend(spec)
    status = structural(JobStatus.model_json_schema(by_alias=True, mode="serialization"))
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}",
                     "labels": {"app.kubernetes.io/name": "autopar", "app.kubernetes.io/part-of": "autopar"}},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": list(SHORT_NAMES), "categories": ["all", "autopar"]},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A training job that autopar plans (a parallelization faster than data "
                                   "parallelism, found by simulation), trains and reports on.",
                    "properties": {
                        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                        "spec": spec, "status": status},
                    "required": ["spec"]}},
            }],
        },
    }


def crd_yaml() -> str:
    head = (f"# The {KIND} CRD ({API_VERSION}), generated from autopar/job/spec.py by `autopar crd`.\n"
            "# Do not edit: change the spec models and run `autopar crd > crds/paralleltrainingjobs.autopar.dev.yaml`.\n")
    return head + yaml.safe_dump(crd(), sort_keys=False, width=120)


def structural(schema: dict[str, Any]) -> dict[str, Any]:
    """pydantic's JSON schema -> a Kubernetes structural schema: ``$ref`` inlined, ``anyOf [X, null]``
    folded into ``nullable``, JSON Schema 2020's numeric exclusive bounds written as OpenAPI 3.0's
    booleans, ``maxLength`` of maps and lists as ``maxProperties``/``maxItems``, titles dropped."""
    defs = schema.get("$defs", {})

    def conv(node: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in node:
            name = node["$ref"].split("/")[-1]
            out = conv({**defs[name], **{k: v for k, v in node.items() if k != "$ref"}})
            if name in RULES:
                out["x-kubernetes-validations"] = copy.deepcopy(RULES[name])
            return out
        if "anyOf" in node:
            real = [v for v in node["anyOf"] if v.get("type") != "null"]
            if len(real) != 1 or len(node["anyOf"]) != 2:
                raise ValueError(f"cannot express anyOf {node['anyOf']} in a structural schema")
            out = {**conv(real[0]), "nullable": True}
            out.update({k: v for k, v in node.items() if k == "description" or k.startswith("x-kubernetes-")})
            if node.get("default") is not None:
                out["default"] = node["default"]
            return out
        out = {}
        kind = node.get("type")
        for key, value in node.items():
            if key in ("title", "$defs", "additionalProperties"):
                continue
            if key == "properties":
                out[key] = {k: conv(v) for k, v in value.items()}
            elif key == "items":
                out[key] = conv(value)
            elif key == "const":
                out["enum"] = [value]
            elif key in ("exclusiveMinimum", "exclusiveMaximum"):
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
            elif key == "maxLength" and kind in ("object", "array"):
                out["maxProperties" if kind == "object" else "maxItems"] = value
            else:
                out[key] = value
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and extra and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = conv(extra)
        return out

    root = conv({k: v for k, v in schema.items() if k != "$defs"})
    for field, prop in root.get("properties", {}).items():
        if field in RULES:
            prop["x-kubernetes-validations"] = copy.deepcopy(RULES[field])
    return root


def _section_defaults(spec: dict[str, Any]) -> None:
    """Every optional section of the spec defaults to the models' defaults, written out whole: the
    API server checks a default against the section's CEL rules as it is (without the defaults of
    the fields inside it), and a section that always exists keeps the transition rules running."""
    defaults = JobSpec.model_validate({"model": {"name": "x"}}).model_dump(by_alias=True, exclude_none=True,
                                                                          mode="json")
    for field, prop in spec["properties"].items():
        if field not in spec.get("required", []) and prop.get("type") == "object":
            prop["default"] = defaults[field]


def _immutable_except_suspend(spec: dict[str, Any]) -> None:
    """Transition rules: every field of the spec is fixed once created, except runPolicy.suspend."""
    run_policy = spec["properties"]["runPolicy"]
    fixed = [(f"spec.{f}", p, " create a new job instead") for f, p in spec["properties"].items() if f != "runPolicy"]
    fixed += [(f"spec.runPolicy.{f}", p, "") for f, p in run_policy["properties"].items() if f != "suspend"]
    for path, prop, advice in fixed:
        prop.setdefault("x-kubernetes-validations", []).append(
            {"rule": "self == oldSelf",
             "message": f"{path} cannot change after the job is created (only runPolicy.suspend can)"
                        + (";" + advice if advice else "")})
    # A field that was set cannot be removed either (a transition rule on it would not run then).
    optional = [f for f, p in run_policy["properties"].items() if f != "suspend" and "default" not in p]
    if optional:
        run_policy.setdefault("x-kubernetes-validations", []).append(
            {"rule": " && ".join(f"has(self.{f}) == has(oldSelf.{f})" for f in optional),
             "message": "spec.runPolicy fields cannot be added or removed after the job is created "
                        "(only runPolicy.suspend can change)"})
