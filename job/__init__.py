"""autopar's job: the `ParallelTrainingJob` spec, its CRD, and the pipeline that runs it.

The pipeline (validate → describe the topology → plan → train → report) has two drivers: `local`
runs it in-process on this machine's worker processes (`autopar run JOB.yaml --local`), and the
operator drives the same steps through Kubernetes objects.  This layer imports the planner and the
trainer, never kopf or the Kubernetes client, so both drivers can use it.

- `spec` — the pydantic models of the manifest (spec and status) and `load_job`;
- `crd` — the CustomResourceDefinition generated from them (`autopar crd`).
"""

from .crd import crd, crd_yaml
from .spec import (ALGORITHMS, API_VERSION, GROUP, KIND, PLURAL, VERSION, JobSpec, JobSpecError, JobStatus,
                   ParallelTrainingJob, load_job, parse_job)

__all__ = ["ALGORITHMS", "API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "JobSpec", "JobSpecError", "JobStatus",
           "ParallelTrainingJob", "crd", "crd_yaml", "load_job", "parse_job"]
