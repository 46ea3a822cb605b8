"""The `autopar` command.

    autopar simulate --model nmt --topology p100-4x4            # compare the built-in strategies
    autopar simulate --model nmt --topology p100-4x4 --strategy plan.yaml --json
    autopar plan --model nmt --topology p100-4x4 --budget 60 --out plan.yaml
    autopar train --model lenet --strategy plan.yaml --nproc 2 --steps 20
    autopar profile --model lenet --topology local:2            # measure op times into the cache
    autopar run examples/quickstart.yaml --local                # the whole job: profile, plan, train, report
    autopar crd                                                 # the ParallelTrainingJob CRD (YAML)
    autopar operator run --namespace ml                         # the Kubernetes operator
    autopar bench simulator --json                              # full vs delta simulation
    autopar models | autopar topologies                         # what can be named

Every command takes `--json` for machine-readable output.  Errors that a user can fix are printed
as one line starting with ``autopar: error:`` and exit with status 2; nothing is half-written.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from autopar.planner.errors import AutoparError

from ._common import add_model_args


def _build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `command` (the first word of the command line) the options of ``train``,
    whose module imports torch, are added only when that is the command (or unknown)."""
    p = argparse.ArgumentParser(
        prog="autopar",
        description="Find a parallelization of a PyTorch model for a cluster that beats data parallelism "
                    "(FlexFlow's SOAP search with an execution simulator), and train with it.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    r = sub.add_parser("run", help="run a ParallelTrainingJob manifest: profile, plan, train, report",
                       description="Run the job of a ParallelTrainingJob manifest (the file you would kubectl "
                                   "apply). With --local, on this machine: its devices become worker processes "
                                   "(local:N, N = nodes x gpusPerNode), what the plans need is profiled into the "
                                   "profile cache, the plan is found with the job's planner settings and trained "
                                   "for the job's steps with checkpoints. Writes a run directory (plan file, "
                                   "picture, simulated and measured traces, metrics, report.json) and prints the "
                                   "plan against data parallelism, the measured step time and the prediction "
                                   "error. Ctrl-C stops after the current step and leaves a checkpoint.")
    r.add_argument("job", metavar="JOB.yaml", help="the ParallelTrainingJob manifest (examples/quickstart.yaml)")
    r.add_argument("--local", action="store_true", help="run here, without a cluster (required for now)")
    r.add_argument("--compare", action="store_true",
                   help="also train data parallelism for the same steps, to measure the real speedup")
    r.add_argument("--run-dir", metavar="DIR", help="where the run's files go (default autopar-runs/<job>-<time>)")
    r.add_argument("--resume", metavar="RUN_DIR",
                   help="train the plan of an earlier, stopped run of this job on from its latest checkpoint")
    r.add_argument("--profile-cache", metavar="FILE", default=None,
                   help="measured op times and calibration (default: $AUTOPAR_CACHE_DIR or "
                        "~/.cache/autopar/profile.json)")
    r.add_argument("--no-profile", action="store_true",
                   help="plan with what the profile cache holds (ops not in it are estimated analytically)")
    r.add_argument("--recalibrate", action="store_true",
                   help="measure the runtime calibration of local:N, and the runtime's work per op in the model's "
                        "steps, again")
    r.add_argument("--metrics-port", type=int, metavar="P", help="serve the trainer's Prometheus metrics on P")
    r.add_argument("--retime", action="store_true",
                   help="price the plan again with its ops (and the optimizer and the runtime's per-op "
                        "overheads) timed in the training ranks (autopar train --retime): "
                        "the report's simulated step, and its prediction error, are that price; the search's stays "
                        "beside as planned_step_s")
    r.add_argument("--json", action="store_true",
                   help="the report as JSON on stdout (progress and the short report go to stderr)")
    r.set_defaults(func=_cmd_run)

    op = sub.add_parser("operator", help="the Kubernetes operator, and the commands its pods run",
                        description="`autopar operator run` runs the operator (kopf): it discovers the topology "
                                    "of every ParallelTrainingJob from node labels, plans in a planner Job, runs "
                                    "one trainer pod per node, restarts, re-plans, and exports metrics.")
    opsub = op.add_subparsers(dest="operator_command", metavar="SUBCOMMAND", required=True)
    orun = opsub.add_parser("run", help="run the operator until stopped",
                            description="Watch ParallelTrainingJobs (in --namespace, repeatable; all namespaces "
                                        "without it) and reconcile them. Serves /metrics, /healthz and /readyz "
                                        "on --metrics-port.")
    orun.add_argument("--namespace", "-n", action="append", default=[], help="namespace to watch (repeatable)")
    orun.add_argument("--kubeconfig", help="kubeconfig (default: in a pod its ServiceAccount, else $KUBECONFIG)")
    orun.add_argument("--image", help="image of the planner and trainer pods (a job's model.image wins)")
    orun.add_argument("--planner-image", help="image of the planner pods (default: --image); the planner needs "
                                              "no CUDA, so the small operator image will do")
    orun.add_argument("--profile-cache-claim", metavar="PVC",
                      help="PersistentVolumeClaim holding the shared profile cache of the planner pods")
    orun.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="what trainer pods train on")
    orun.add_argument("--metrics-port", type=int, default=8080, help="port of /metrics, /healthz and /readyz")
    orun.add_argument("--metrics-address", default="0.0.0.0", help="address of /metrics, /healthz and /readyz")
    orun.add_argument("--peering", metavar="NAME",
                      help="coordinate several replicas through kopf's peering object NAME (one is active, "
                           "the others wait; needs kopf's KopfPeering/ClusterKopfPeering CRDs); without it the "
                           "operator runs standalone and must be the only replica")
    orun.set_defaults(func=_cmd_operator_run)
    pp = opsub.add_parser("publish-plan", help="patch a plan file into the job's plan ConfigMap (the planner pod)")
    pp.add_argument("--plan", required=True, help="the plan file `autopar plan --out` wrote")
    pp.add_argument("--config-map", required=True, help="the placeholder ConfigMap <job>-plan")
    pp.add_argument("--namespace", default=None, help="default: the pod's namespace")
    pp.add_argument("--topology-fingerprint", default=None, help="the topology the plan was made for")
    pp.add_argument("--kubeconfig", default=None, help="default: in a pod its ServiceAccount, else $KUBECONFIG")
    pp.add_argument("--json", action="store_true")
    pp.set_defaults(func=_cmd_publish_plan)
    rp = opsub.add_parser("report-progress", help="report rank 0's training progress into the job's status (sidecar)")
    rp.add_argument("--job", required=True, help="the ParallelTrainingJob's name")
    rp.add_argument("--namespace", default=None, help="default: the pod's namespace")
    rp.add_argument("--metrics-url", required=True,
                    help="rank 0's Prometheus endpoint, e.g. http://127.0.0.1:9090/metrics")
    rp.add_argument("--interval", type=float, default=5.0, help="seconds between scrapes (default 5)")
    rp.add_argument("--gone-after", type=float, default=60.0,
                    help="exit 0 once the endpoint has not answered for this many seconds (default 60)")
    rp.add_argument("--once", action="store_true", help="scrape and report once, then exit")
    rp.add_argument("--kubeconfig", default=None, help="default: in a pod its ServiceAccount, else $KUBECONFIG")
    rp.set_defaults(func=_cmd_report_progress)

    c = sub.add_parser("crd", help="print the ParallelTrainingJob CustomResourceDefinition (YAML)",
                       description="Print the CRD generated from the job spec models (autopar.job.spec); "
                                   "crds/paralleltrainingjobs.autopar.dev.yaml is this output.")
    c.add_argument("--json", action="store_true", help="JSON instead of YAML")
    c.set_defaults(func=_cmd_crd)

    s = sub.add_parser("simulate", help="simulate strategies of a model on a topology and compare them",
                       description="Simulate one training step (forward, backward, parameter synchronization, "
                                   "update) of MODEL on TOPOLOGY under each --strategy and compare them. "
                                   "Without --strategy every named strategy is simulated.")
    add_model_args(s)
    s.add_argument("--strategy", "-s", action="append", default=[], metavar="S",
                   help="named strategy (data-parallel, model-parallel, single-device, …) or a plan file; repeatable")
    s.add_argument("--plot", metavar="FILE.png", help="draw the (first) strategy and its simulated timeline")
    s.add_argument("--trace", metavar="FILE.json",
                   help="write the (first) strategy's simulated step as Chrome trace-event JSON (open it in "
                        "ui.perfetto.dev beside the trace of `autopar train --trace`)")
    s.set_defaults(func=_cmd_simulate)

    pl = sub.add_parser("plan", help="search for the fastest strategy and write a plan file",
                        description="Search the SOAP space of MODEL on TOPOLOGY (baselines, OptCNN's dynamic "
                                    "programming, MCMC with delta simulation from several starts) and write the "
                                    "best strategy found — never slower in simulation than any baseline tried — "
                                    "to a plan file (YAML or JSON by extension).")
    add_model_args(pl)
    pl.add_argument("--budget", type=float, default=30.0, metavar="SECONDS", help="MCMC search time")
    pl.add_argument("--out", default="plan.yaml", metavar="FILE", help="plan file to write (.yaml or .json)")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--max-proposals", type=int, default=None,
                    help="bound every MCMC chain by proposals instead of time (bit-reproducible)")
    pl.add_argument("--plot", metavar="FILE.png", help="draw the plan and its simulated timeline")
    pl.set_defaults(func=_cmd_plan)

    tr = sub.add_parser("train", help="train a model with a strategy on local ranks (or under torchrun)",
                        description="Train MODEL with STRATEGY: every rank executes the tasks the plan gives its "
                                    "device (torch.distributed: gloo on CPU, NCCL on GPU). Starts --nproc local "
                                    "ranks, or runs as one rank under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, "
                                    "MASTER_ADDR, MASTER_PORT). Prints per-step time and loss, and a summary "
                                    "with the median measured step time beside the plan's predicted one and, on "
                                    "CPU ranks, both split into compute, transfer, synchronization, optimizer and "
                                    "overhead, with the part furthest off.")
    add_model_args(tr, topology=False)
    if command in (None, "train"):    # autopar.trainer imports torch: not for `autopar operator run`
        from autopar.trainer import add_train_args
        add_train_args(tr)
    tr.set_defaults(func=_cmd_train, graceful_stop=True)

    pr = sub.add_parser("profile", help="measure op times on this machine into the profile cache",
                        description="Run every distinct task of MODEL that a strategy on TOPOLOGY (a local:N "
                                    "topology) can produce on this machine's CPU (or GPU when present), with "
                                    "warm-up and the mean of repeats, and store forward/backward times in "
                                    "the profile cache the cost model reads.  On the CPU the N workers measure "
                                    "side by side, as they train, and their times are kept apart from other "
                                    "N's: a local:1 profile does not price a local:2 plan.  Each task is measured "
                                    "with the core's L2 evicted before every call, each call followed by calls "
                                    "back to back with nothing evicted, and again with the last-level cache "
                                    "evicted; the simulator prices it between the two by what the cores' shared "
                                    "cache holds of its data in the step, from its back-to-back time where the "
                                    "step runs it right after the same task.")
    add_model_args(pr)
    pr.add_argument("--repeats", type=int, default=5,
                    help="timed runs per task (their mean is kept: a step pays its slow calls too)")
    pr.add_argument("--rounds", type=int, default=3,
                    help="passes over all tasks, one after another; each task keeps its median pass (the "
                         "machine's speed moves from second to second)")
    pr.add_argument("--warmup", type=int, default=5,
                    help="untimed runs per task first (the first few backward passes fault in fresh gradient pages)")
    pr.add_argument("--max-tasks", type=int, default=None, help="profile at most this many new task shapes")
    pr.add_argument("--no-calibrate", action="store_true",
                    help="only op times: skip measuring the runtime calibration of local:N (communication, "
                         "per-op overheads, optimizer, staging of messages; about 150 s, once per machine and N) "
                         "and the runtime's work per op in the model's own steps (a few seconds, once per model)")
    pr.add_argument("--recalibrate", action="store_true",
                    help="measure the runtime calibration, and the runtime's work per op in the model's steps, "
                         "again even when the cache already holds them for local:N")
    pr.set_defaults(func=_cmd_profile)

    b = sub.add_parser("bench", help="the benchmarks the project is judged by",
                       description="Benchmarks. `simulator`: full vs delta simulation on paper models. "
                                   "`search`: baselines, OptCNN and MCMC on the zoo at 4, 16 and 64 GPUs. "
                                   "`runtime`: our runtime against DistributedDataParallel, and a searched plan "
                                   "against data parallelism, measured on local ranks. `accuracy`: simulated "
                                   "against measured step time for 4 models x >= 6 strategies on 2 local ranks "
                                   "(progress on stderr). `operator`: the operator on a real control plane (from "
                                   "a source checkout), 1,000 simulated GPU nodes and 50 pinned-plan jobs: create "
                                   "to trainer pods p50/p95, discovery time, API requests per job, peak RSS.")
    b.add_argument("which", choices=_bench_choices(), help="which benchmark")
    b.add_argument("--json", action="store_true", help="JSON on stdout")
    b.add_argument("--quick", action="store_true", help="smaller settings for a 2-core machine")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--keep", metavar="DIR",
                   help="accuracy: keep the run in the new folder DIR (its profile cache with the calibration, the "
                        "op times taken between and after each model's steps, the message workloads' records "
                        "taken between them, and the JSON), for --rescore")
    b.add_argument("--rescore", metavar="DIR", nargs="+",
                   help="accuracy: measure nothing; simulate the rows of the runs kept in DIR... again with this "
                        "code (their messages fitted again from the records, where kept), and report each run's "
                        "totals and all of them pooled, as recorded and now")
    b.add_argument("--row-profile", choices=("search", "during_steps"),
                   help="accuracy --rescore: price every kept run's rows with the search's profile or with the ops "
                        "the training ranks timed between the blocks of the steps, whichever the run priced them "
                        "with (runs kept since 2026-12-01: during_steps)")
    b.add_argument("--uniform-placements", action="store_true",
                   help="simulator: draw changes with uniformly random device placements instead of the "
                        "search's proposals (random degrees on aligned device blocks, one task moved, or a whole op "
                        "shifted to another block)")
    b.add_argument("--all-changes", action="store_true",
                   help="simulator: also measure changes MCMC rejects unbuilt (an edit that would build more "
                        "than twice the link placements of the graph it starts from: tasks counted once per "
                        "link they occupy); by default they are redrawn")
    b.set_defaults(func=_cmd_bench)

    m = sub.add_parser("models", help="list the zoo models and their options")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=_cmd_models)
    t = sub.add_parser("topologies", help="list the topology presets")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=_cmd_topologies)
    return p


def _bench_choices() -> list[str]:
    return ["simulator", "search", "runtime", "accuracy", "operator"]


def _cmd_run(args) -> int:
    from autopar.job.local import format_report, run_job
    from ._common import emit_json
    if not args.local:
        raise AutoparError(f"autopar run {args.job}: add --local to run the job on this machine; on a cluster, "
                           f"`kubectl apply -f {args.job}` with the autopar operator installed")
    doc, status = run_job(args.job, run_dir=args.run_dir, compare=args.compare, profile_cache=args.profile_cache,
                          recalibrate=args.recalibrate, profile=not args.no_profile, metrics_port=args.metrics_port,
                          resume=args.resume, retime=args.retime)
    if args.json:
        print(format_report(doc), file=sys.stderr)   # people read stderr; programs read the JSON
        emit_json(doc)
    else:
        print(format_report(doc))
    return status


def _cmd_operator_run(args) -> int:
    import logging

    from autopar.operator.handlers import run
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(namespaces=args.namespace or None, kubeconfig=args.kubeconfig, image=args.image,
        profile_cache_claim=args.profile_cache_claim, device=args.device, metrics_port=args.metrics_port,
        metrics_address=args.metrics_address, peering=args.peering, planner_image=args.planner_image)
    return 0


def _cmd_publish_plan(args) -> int:
    from autopar.operator.podside import publish_plan_main
    return publish_plan_main(args)


def _cmd_report_progress(args) -> int:
    from autopar.operator.podside import report_progress_main
    return report_progress_main(args)


def _cmd_crd(args) -> int:
    from autopar.job import crd, crd_yaml
    from ._common import emit_json
    if args.json:
        emit_json(crd())
    else:
        sys.stdout.write(crd_yaml())
    return 0


def _cmd_simulate(args) -> int:
    from ._simulate import run_simulate
    return run_simulate(args)


def _cmd_plan(args) -> int:
    from ._plan import run_plan
    return run_plan(args)


def _cmd_train(args) -> int:
    from autopar.trainer import format_summary, train_main
    from autopar.trainer.train import exit_status
    from ._common import emit_json
    summary = train_main(args)
    if summary is None:
        return 0
    if args.json:
        emit_json(summary)
    else:
        print(format_summary(summary))
    return exit_status(summary)    # 130/143 when stopped by Ctrl-C/SIGTERM (with a checkpoint)


def _cmd_profile(args) -> int:
    from ._profile import run_profile
    return run_profile(args)


def _cmd_bench(args) -> int:
    from ._common import emit_json
    if args.row_profile and not args.rescore:
        raise AutoparError("autopar bench: --row-profile prices kept runs again; it is an option of "
                           "`autopar bench accuracy --rescore DIR...`")
    if (args.keep or args.rescore) and args.which != "accuracy":
        raise AutoparError(f"autopar bench {args.which}: --keep and --rescore are options of `autopar bench "
                           "accuracy`; drop them")
    if args.which == "simulator":
        from .bench_simulator import print_table, run_simulator_bench
        doc = run_simulator_bench(quick=args.quick, seed=args.seed, progress=not args.json,
                                  uniform=args.uniform_placements, all_changes=args.all_changes)
    elif args.which == "search":
        from autopar.planner.search import bench_table, run_search_bench
        doc = run_search_bench(quick=args.quick, seed=args.seed, progress=not args.json)
        if not args.json:
            from rich.console import Console
            Console(width=None if sys.stdout.isatty() else 140).print(bench_table(doc))
            return 0
    elif args.which == "runtime":
        from autopar.trainer.bench import print_table, run_runtime_bench
        doc = run_runtime_bench(quick=args.quick)
    elif args.which == "accuracy" and args.rescore:
        from autopar.trainer.rescore import print_rescore as print_table
        from autopar.trainer.rescore import rescore
        if args.keep or args.quick:
            raise AutoparError("autopar bench accuracy: --rescore measures nothing, so --keep and --quick do not "
                               "apply; drop them, or drop --rescore to measure a new run")
        doc = rescore(args.rescore, progress=True, row_profile=args.row_profile)
    elif args.which == "accuracy":
        from autopar.trainer.accuracy import print_table, run_accuracy_bench
        doc = run_accuracy_bench(quick=args.quick, progress=True, keep=args.keep)
    elif args.which == "operator":
        from .bench_operator import print_table, run_operator_bench
        doc = run_operator_bench(quick=args.quick, progress=True)
    else:  # argparse restricts the choices
        raise AssertionError(args.which)
    if args.json:
        emit_json(doc)
    else:
        print_table(doc)
    return 0


def _cmd_models(args) -> int:
    from autopar.planner.zoo import list_models, model_options
    from ._common import emit_json
    rows = [{"name": name, "options": model_options(name)} for name in list_models()]
    if args.json:
        emit_json({"models": rows})
        return 0
    for r in rows:
        opts = " ".join(f"{k}={v}" for k, v in r["options"].items())
        print(f"{r['name']:<14} {opts}")
    return 0


def _cmd_topologies(args) -> int:
    from autopar.planner.hardware import get_preset, list_presets
    from ._common import emit_json
    rows = []
    for name in list_presets():
        topo = get_preset(name)
        rows.append({"name": name, "devices": topo.num_devices, "nodes": len(topo.nodes), "summary": topo.summary()})
    if args.json:
        emit_json({"topologies": rows})
        return 0
    for r in rows:
        print(f"{r['name']:<14} {r['summary']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    parser = _build_parser(words[0] if words else None)
    args = parser.parse_args(argv)
    if os.environ.get("AUTOPAR_THREADS"):
        import torch
        torch.set_num_threads(int(os.environ["AUTOPAR_THREADS"]))
    try:
        return args.func(args)
    except AutoparError as e:
        print(f"autopar: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autopar: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
