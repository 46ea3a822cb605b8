"""The `ParallelTrainingJob`: one file that says "train this model, on these devices, with this budget".

    apiVersion: autopar.dev/v1alpha1
    kind: ParallelTrainingJob
    metadata: {name: quickstart}
    spec:
      model: {name: rnnlm, options: {hidden: 256}}
      training: {steps: 30, batchSize: 16}
      devices: {nodes: 1, gpusPerNode: 2}
      planner: {algorithm: auto, budgetSeconds: 20}

The same manifest is `kubectl apply`d to a cluster and run by `autopar run JOB.yaml --local`.
These pydantic models are the single source of the job's shape: the CRD's structural schema
(`job.crd`) is generated from them, defaults included, so the API server and the local driver
apply the same defaults and ranges.  What a schema cannot say (a zoo model's options, whether a
factory imports) is checked by the pipeline's validate step (`job.pipeline.validate`).

Field names are camelCase, as in every Kubernetes API; the run policy follows Kubeflow's
(`backoffLimit`, `activeDeadlineSeconds`, `ttlSecondsAfterFinished`, `suspend`) and the
scheduling fields a gang scheduler or Kueue reads (`schedulerName`, `queueName`).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from autopar.planner.errors import AutoparError

GROUP = "autopar.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ParallelTrainingJob"
PLURAL = "paralleltrainingjobs"
SINGULAR = "paralleltrainingjob"
SHORT_NAMES = ("ptj",)

#: Named strategies of `planner.search.named` that a job may pin as its algorithm (the search's
#: baselines); a test checks this list against the planner's.
NAMED_STRATEGIES = ("data-parallel", "model-parallel", "single-device", "expert", "expert-cnn", "expert-rnn",
                    "layer-placement", "placement")
ALGORITHMS = ("auto", "mcmc", "optcnn", "pinned", *NAMED_STRATEGIES)
DTYPES = ("float32", "float64", "float16", "bfloat16")
OPTIMIZERS = ("sgd", "adam")
PHASES = ("Pending", "Suspended", "Planning", "Training", "Succeeded", "Failed", "Stopped")

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_MODEL_REF = r"^[A-Za-z_][A-Za-z0-9_.]*(:[A-Za-z_][A-Za-z0-9_.]*)?$"


class JobSpecError(AutoparError):
    """A job manifest that does not validate; the message names the field and what to do."""


class _Spec(BaseModel):
    """camelCase in the manifest, snake_case in Python; unknown fields are refused (a typo in a
    field name must not silently fall back to a default)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


# -- the spec ------------------------------------------------------------------------------------

class ModelRef(_Spec):
    """Which model to train."""

    name: str = Field(min_length=1, max_length=253, pattern=_MODEL_REF,
                      description="A zoo model (lenet, alexnet, vgg16, inception_v3, resnet101, rnntc, rnnlm, nmt, "
                                  "transformer) or 'package.module:factory', a function returning an "
                                  "autopar.planner.zoo.ModelSpec.")
    options: dict[str, Any] = Field(default_factory=dict, max_length=64, json_schema_extra={
        "x-kubernetes-preserve-unknown-fields": True},
        description="Keyword arguments of the model's factory (`autopar models` lists a zoo model's options).")
    image: str | None = Field(default=None, max_length=512,
                              description="Container image that holds the factory's module (cluster runs of a "
                                          "'package.module:factory' model); the operator's default image otherwise.")


class TrainingSpec(_Spec):
    """What one training run does."""

    steps: int = Field(default=100, ge=1, le=10_000_000, description="Training steps.")
    batch_size: int | None = Field(default=None, ge=1, le=1_048_576,
                                   description="Global batch size (the model's 'batch' option); default: the model's.")
    optimizer: Literal[OPTIMIZERS] = Field(default="sgd", description="Optimizer, applied to every parameter shard.")
    learning_rate: float = Field(default=0.01, gt=0, le=100, description="Learning rate.")
    momentum: float = Field(default=0.9, ge=0, lt=1, description="SGD momentum.")
    dtype: Literal[DTYPES] | None = Field(default=None, description="Train in this float dtype; default: the model's.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1,
                      description="Seed of the synthetic data and of dropout (the same for every strategy).")


class DataSpec(_Spec):
    """Where the batches come from."""

    source: Literal["synthetic", "file"] = Field(
        default="synthetic", description="'synthetic': seeded random batches of the model's input shapes; "
                                         "'file': a torch.save'd dict of input and label tensors at `path`.")
    path: str | None = Field(default=None, max_length=4096, description="The data file (source: file).")

    @model_validator(mode="after")
    def _file_needs_path(self) -> DataSpec:
        if self.source == "file" and not self.path:
            raise ValueError("data.source 'file' needs data.path (the torch.save'd dict of input and label tensors)")
        return self


class Toleration(_Spec):
    """A Kubernetes toleration, copied onto the planner and trainer pods."""

    key: str | None = Field(default=None, max_length=316)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)


class DevicesSpec(_Spec):
    """The devices wanted.  `autopar run --local` runs nodes × gpusPerNode worker processes."""

    nodes: int = Field(default=1, ge=1, le=1024, description="Nodes (one trainer pod per node).")
    gpus_per_node: int = Field(default=2, ge=1, le=64, description="GPUs per node (worker processes with --local).")
    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(default_factory=dict, max_length=32,
                                          description="Labels a node must have, e.g. nvidia.com/gpu.product.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)

    @property
    def count(self) -> int:
        return self.nodes * self.gpus_per_node


class PlanRef(_Spec):
    """Where a pinned plan file is: a ConfigMap key in the job's namespace, or a path."""

    config_map: str | None = Field(default=None, max_length=253, pattern=_DNS_LABEL.replace("[-a-z0-9]", "[-.a-z0-9]"),
                                   description="ConfigMap that holds the plan file.")
    key: str = Field(default="plan.yaml", max_length=253, description="Key of the plan file in the ConfigMap.")
    path: str | None = Field(default=None, max_length=4096,
                             description="Path of the plan file (relative to the manifest with --local).")

    @model_validator(mode="after")
    def _one_source(self) -> PlanRef:
        if (self.config_map is None) == (self.path is None):
            raise ValueError("planRef needs exactly one of configMap and path")
        return self


class PlannerSpec(_Spec):
    """How the plan is found."""

    algorithm: Literal[ALGORITHMS] = Field(
        default="auto", description="auto: baselines, OptCNN and MCMC, the fastest in simulation; mcmc: MCMC from "
                                    "the baselines only; optcnn: OptCNN's dynamic programming; pinned: the plan "
                                    "file of planRef; or a named baseline.")
    budget_seconds: float = Field(default=30.0, ge=0, le=86_400, description="MCMC search time.")
    max_proposals: int | None = Field(default=None, ge=1,
                                      description="Bound every MCMC chain by proposals instead of time "
                                                  "(bit-reproducible plans).")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the search.")
    replan_margin: float = Field(default=0.05, ge=0, le=1,
                                 description="When the hardware changes, switch to a new plan only if it is "
                                             "predicted this much faster than the current one (0.05: 5 %).")
    plan_ref: PlanRef | None = Field(default=None, description="The plan of algorithm 'pinned'.")

    @model_validator(mode="after")
    def _pinned_needs_plan(self) -> PlannerSpec:
        if self.algorithm == "pinned" and self.plan_ref is None:
            raise ValueError("algorithm 'pinned' needs planner.planRef (a configMap or a path holding the plan file)")
        return self


class CheckpointSpec(_Spec):
    """Strategy-independent checkpoints (any plan resumes from any checkpoint)."""

    path: str | None = Field(default=None, max_length=4096,
                             description="Directory of the checkpoints (a shared volume in a cluster); "
                                         "default with --local: checkpoints/ in the run directory.")
    every_steps: int = Field(default=0, ge=0, description="Write a checkpoint every N steps (0: only at the end "
                                                          "and when stopped).")


class RunPolicy(_Spec):
    """Kubeflow's run policy, plus the scheduler fields a gang scheduler or Kueue reads."""

    backoff_limit: int = Field(default=3, ge=0, le=100, description="Retries of failed trainer pods.")
    active_deadline_seconds: int | None = Field(default=None, ge=1, description="Fail the job after this long.")
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0,
                                                   description="Delete the finished job after this long.")
    suspend: bool = Field(default=False, description="Hold (or stop) the job's pods; the only field that may "
                                                     "change after creation.")
    scheduler_name: str | None = Field(default=None, max_length=253, description="Scheduler of the trainer pods "
                                                                                "(e.g. a gang scheduler).")
    queue_name: str | None = Field(default=None, max_length=253, description="Kueue LocalQueue "
                                                                            "(label kueue.x-k8s.io/queue-name).")
    priority_class_name: str | None = Field(default=None, max_length=253)


class JobSpec(_Spec):
    """The spec of a `ParallelTrainingJob`."""

    model: ModelRef
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    devices: DevicesSpec = Field(default_factory=DevicesSpec)
    planner: PlannerSpec = Field(default_factory=PlannerSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    run_policy: RunPolicy = Field(default_factory=RunPolicy)


# -- the status (written by the drivers; also the CRD's status schema) ----------------------------

class Condition(_Spec):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    observed_generation: int | None = None


class JobStatus(_Spec):
    """What the job reports; the printer columns show phase, devices, the steps and the speedup."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")
    phase: Literal[PHASES] | None = None
    message: str | None = None
    devices: str | None = Field(default=None, description="e.g. '8x H100-SXM5-80GB' or '2x local'.")
    strategy: str | None = Field(default=None, description="The plan being trained.")
    plan_config_map: str | None = None
    plan_hash: str | None = Field(default=None, description="Hash of the plan file the trainers run.")
    algorithm: str | None = Field(default=None, description="How the plan was found.")
    search_seconds: float | None = Field(default=None, description="Wall time of the plan search.")
    topology_fingerprint: str | None = None
    topology: dict[str, Any] | None = Field(default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
                                            description="Summary of the discovered topology: nodes, GPUs, "
                                                        "products, unknown products, NVLink cliques, blocks.")
    simulated_step: str | None = Field(default=None, description="Simulated step time of the plan, for display.")
    actual_step: str | None = Field(default=None, description="Median measured step time, for display.")
    predicted_speedup: str | None = Field(default=None, description="Simulated speedup over data parallelism.")
    simulated_step_seconds: float | None = None
    actual_step_seconds: float | None = None
    data_parallel_step_seconds: float | None = None
    prediction_error: float | None = None
    completed_steps: int | None = None
    restarts: int | None = None
    replans: int | None = None
    replan_pending: bool | None = Field(default=None, description="A new plan is being made for a changed "
                                        "topology while the trainers keep running the current one.")
    kept_plan_hash: str | None = Field(default=None, description="Hash of a newer plan that was not faster than "
                                       "the running one by more than planner.replanMargin, so not switched to.")
    observed_generation: int | None = None
    start_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    completion_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    conditions: list[Condition] = Field(default_factory=list)


class ObjectMeta(BaseModel):
    """The parts of Kubernetes object metadata a job uses; the rest is kept and ignored."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = Field(min_length=1, max_length=63, pattern=_DNS_LABEL)
    namespace: str = Field(default="default", max_length=63, pattern=_DNS_LABEL)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class ParallelTrainingJob(BaseModel):
    """A whole manifest: apiVersion, kind, metadata and spec (a status in the file is ignored)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)
    api_version: Literal[API_VERSION] = Field(alias="apiVersion")
    kind: Literal[KIND]
    metadata: ObjectMeta
    spec: JobSpec
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    def to_manifest(self) -> dict[str, Any]:
        """The manifest with every default written out (what the API server stores)."""
        return {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": self.metadata.model_dump(exclude_defaults=False, exclude={"labels", "annotations"}
                                                     if not (self.metadata.labels or self.metadata.annotations)
                                                     else set()),
                "spec": _without_empty(self.spec.model_dump(by_alias=True, exclude_none=True, mode="json"))}


def _without_empty(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` without empty maps and lists below its top level, as the API server stores it (it
    defaults neither)."""
    out = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            v = _without_empty(v)
        if v != {} and v != []:
            out[k] = v
    return out


# -- reading manifests ---------------------------------------------------------------------------

def parse_job(doc: Any, source: str = "manifest") -> ParallelTrainingJob:
    """Validate a manifest (a dict); raises `JobSpecError` naming every bad field and what to do."""
    if not isinstance(doc, dict):
        raise JobSpecError(f"{source}: expected a ParallelTrainingJob mapping (apiVersion, kind, metadata, spec), "
                           f"got {type(doc).__name__}")
    if doc.get("kind") not in (None, KIND):
        raise JobSpecError(f"{source}: kind is {doc.get('kind')!r}; expected {KIND}")
    if doc.get("apiVersion") not in (None, API_VERSION):
        raise JobSpecError(f"{source}: apiVersion is {doc.get('apiVersion')!r}; expected {API_VERSION}")
    try:
        return ParallelTrainingJob.model_validate(doc)
    except ValidationError as e:
        raise JobSpecError(f"{source}: " + "; ".join(_describe(err) for err in e.errors())) from None


def load_job(path: str | Path) -> ParallelTrainingJob:
    """Read and validate a job manifest (YAML or JSON; in a multi-document file, the one job)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobSpecError(f"{p}: no such file; give the path of a ParallelTrainingJob manifest "
                           "(examples/quickstart.yaml is one)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise JobSpecError(f"{p}: cannot read it ({e})") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise JobSpecError(f"{p}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(docs) == 1:
        jobs = docs
    if len(jobs) != 1:
        raise JobSpecError(f"{p}: expected one {KIND} document, found {len(jobs)} among {len(docs)} document(s)")
    return parse_job(jobs[0], source=str(p))


def _describe(err: dict[str, Any]) -> str:
    """One pydantic error as '<field path>: <what is wrong>; <what is allowed>'."""
    loc = [str(x) for x in err["loc"]]
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        parent, field = ".".join(loc[:-1]) or "the manifest", loc[-1]
        allowed = _fields_at(loc[:-1])
        close = difflib.get_close_matches(field, allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{_path(loc)}: unknown field; {hint}fields of {parent}: {', '.join(allowed)}"
    where = _path(x for x in loc if not x.startswith(("function-", "literal[", "nullable[")))
    if kind == "missing":
        return f"{where}: required field is missing"
    if kind == "literal_error":
        return f"{where}: {value!r} is not allowed; choose one of {ctx.get('expected', '')}"
    if kind == "value_error":
        return f"{where or 'spec'}: {str(err['msg']).removeprefix('Value error, ')}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        bound = {"greater_than_equal": "at least", "greater_than": "more than", "less_than_equal": "at most",
                 "less_than": "less than"}[kind]
        limit = next(iter(ctx.values()), "?")
        return f"{where}: must be {bound} {limit}, got {value!r}"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == _DNS_LABEL:
        return (f"{where}: {value!r} is not a DNS label: use lower-case letters, digits and '-', starting and "
                "ending with a letter or digit")
    if kind == "string_pattern_mismatch":
        return f"{where}: {value!r} does not match {ctx.get('pattern')}"
    return f"{where}: {err['msg'][0].lower() + err['msg'][1:]}, got {value!r}"


def _path(parts) -> str:
    """``spec.devices.tolerations[0].operator`` from pydantic's location tuple."""
    out = ""
    for p in parts:
        out += f"[{p}]" if str(p).isdigit() else (f".{p}" if out else str(p))
    return out


def _fields_at(loc: list[str]) -> list[str]:
    """The camelCase fields of the model at `loc` (for 'did you mean' on unknown fields)."""
    model: Any = ParallelTrainingJob
    for part in loc:
        if part.isdigit():
            continue
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        ann = getattr(field, "annotation", None)
        sub = next((a for a in getattr(ann, "__args__", ()) + (ann,) if isinstance(a, type)
                    and issubclass(a, BaseModel)), None)
        if sub is None:
            return []
        model = sub
    return [f.alias or n for n, f in model.model_fields.items()]


def job_name_ok(name: str) -> bool:
    return re.match(_DNS_LABEL, name) is not None
