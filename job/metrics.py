"""The per-job Prometheus gauges (labels ``namespace``, ``job``): one definition for the
``metrics.prom`` of `autopar run --local` (`job.local`) and the operator's ``/metrics``
(`autopar.operator.metrics`), so a dashboard reads the same names from both drivers.
DESIGN.md fixes the first three names."""

from __future__ import annotations

JOB_LABELS = ("namespace", "job")

#: the job's status field (camelCase, as the operator stores it) -> the gauge's name and help
JOB_GAUGES: dict[str, tuple[str, str]] = {
    "simulatedStepSeconds": ("autopar_job_simulated_step_seconds", "simulated step time of the job's plan"),
    "actualStepSeconds": ("autopar_job_actual_step_seconds",
                          "measured step time of the job's plan (a local run: the median; in a cluster: the mean "
                          "over rank 0's last scrape window)"),
    "predictionError": ("autopar_job_prediction_error", "simulated / measured step time - 1"),
    "dataParallelStepSeconds": ("autopar_job_data_parallel_step_seconds",
                                "simulated step time of data parallelism on the job's devices"),
    "completedSteps": ("autopar_job_completed_steps", "training steps completed, counted from the start"),
}
#: the simulated speedup of the plan over data parallelism
SPEEDUP_GAUGE = ("autopar_job_predicted_speedup", "simulated speedup of the plan over data parallelism")

__all__ = ["JOB_GAUGES", "JOB_LABELS", "SPEEDUP_GAUGE"]
