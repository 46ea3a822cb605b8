"""`autopar profile`: measure op times on this machine into the profile cache (on the CPU twice:
with the core's L2 evicted before every call, each call followed by calls back to back, and with
the last-level cache evicted), the runtime calibration of ``local:N``
(`autopar.trainer.calibrate`) the first time, or with --recalibrate, and the runtime's own work
per op in the model's own steps (`ensure_model_overheads`)."""

from __future__ import annotations

import sys

from autopar.planner.errors import AutoparError

from ._common import emit_json


def run_profile(args) -> int:
    import torch

    from autopar.planner.cost import ProfileCache, default_cache_path, profile_local
    from autopar.planner.zoo import parse_options

    topo = args.topology
    if not (topo == "local" or topo.startswith("local:")):
        raise AutoparError(f"autopar profile measures this machine: --topology must be local or local:N, not {topo!r}; "
                           "other hardware is estimated with the analytic model (or profile on that hardware)")
    workers = int(topo.split(":", 1)[1]) if ":" in topo else 2
    path = args.profile_cache or default_cache_path()
    cache = ProfileCache.load(path)
    if cache.notice:
        print(f"autopar: {cache.notice}", file=sys.stderr)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda" and not getattr(args, "no_calibrate", False):
        from autopar.trainer.calibrate import calibration_target
        calibration_target(workers, "cuda")   # refuse more ranks than GPUs before minutes of profiling
    last = [""]

    def progress(model: str, i: int, n: int, op: str) -> None:
        if args.json or not sys.stderr.isatty():
            return
        line = f"\r{model}: {i}/{n} {op[:40]:<40}"
        last[0] = line
        print(line, end="", file=sys.stderr, flush=True)

    report = profile_local([args.model], workers=workers, options=parse_options(args.model_opt), cache=cache,
                           repeats=args.repeats, warmup=args.warmup, max_tasks=args.max_tasks, device=device,
                           progress=progress, rounds=args.rounds)
    cold = None
    if device.type == "cpu":    # the same tasks with the last-level cache evicted (planner.sim.reuse)
        cold = profile_local([args.model], workers=workers, options=parse_options(args.model_opt), cache=cache,
                             repeats=args.repeats, warmup=args.warmup, max_tasks=args.max_tasks, device=device,
                             progress=progress, rounds=args.rounds, cache_level="llc", cold_keys=True)
    if last[0]:
        print(file=sys.stderr)
    doc = report.to_dict()
    if cold is not None:
        doc["cold"] = cold.to_dict()
    doc["cache"] = str(path)
    doc["calibration"] = _calibration(args, cache, workers, device.type)
    doc["overheads"] = _overheads(args, cache, workers, device.type)
    if args.json:
        emit_json(doc)
        return 0
    print(f"profiled {args.model} for local:{workers} on {report.device_kind}: {len(report.measured)} task shapes "
          f"measured, {report.cached} already cached, {len(report.skipped)} skipped, in {report.seconds:.1f} s")
    if cold is not None:
        print(f"  and with the last-level cache evicted: {len(cold.measured)} measured, {cold.cached} already cached, "
              f"in {cold.seconds:.1f} s")
    for op, degrees, reason in report.skipped[:10]:
        print(f"  skipped {op} {list(degrees)}: {reason}")
    if report.remaining:
        print(f"  {report.remaining} task shapes left unmeasured (--max-tasks); run again to continue")
    cal = doc["calibration"]
    where = f"local:{workers}" if device.type == "cpu" else f"{workers} x {report.device_kind}"
    print(f"calibration of {where} ({cal['status']}): {cal['line']}")
    print(f"runtime overheads ({doc['overheads']['status']}): {doc['overheads']['line']}")
    print(f"cache: {path}")
    return 0


def _calibration(args, cache, workers: int, device: str = "cpu") -> dict:
    """The runtime calibration of ``local:<workers>`` (`autopar.job.pipeline.ensure_calibration`),
    unless --no-calibrate; what `autopar profile` reports."""
    if getattr(args, "no_calibrate", False):
        return {"status": "skipped", "line": "not measured (--no-calibrate)", "world": workers}
    from autopar.job.pipeline import ensure_calibration

    def progress(message: str) -> None:
        if not args.json:
            print(f"calibrating local:{workers}: {message}", file=sys.stderr, flush=True)

    return ensure_calibration(cache, workers, recalibrate=getattr(args, "recalibrate", False), progress=progress,
                              device=device)


def _overheads(args, cache, workers: int, device: str) -> dict:
    """The runtime's own work per op in the model's own steps on ``local:<workers>``
    (`autopar.trainer.calibrate.ensure_model_overheads`), on CPU ranks unless --no-calibrate."""
    if getattr(args, "no_calibrate", False) or device != "cpu":
        why = "--no-calibrate" if device == "cpu" else "on GPUs the calibration's own figures are used"
        return {"status": "skipped", "line": f"not measured ({why})"}
    from autopar.trainer.calibrate import ensure_model_overheads
    from autopar.planner.zoo import parse_options

    def progress(message: str) -> None:
        if not args.json:
            print(f"calibrating local:{workers}: {message}", file=sys.stderr, flush=True)

    return ensure_model_overheads(cache, args.model, parse_options(args.model_opt), workers,
                                  remeasure=getattr(args, "recalibrate", False), progress=progress)
