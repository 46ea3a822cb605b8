"""`autopar plan`: search for the fastest strategy and write it to a plan file."""

from __future__ import annotations

import sys

from ._common import emit_json, load_problem, warn


def run_plan(args) -> int:
    from autopar.planner.plan_file import save_plan
    from autopar.planner.search import plan

    problem = load_problem(args)
    result = plan(problem.graph, problem.topology, problem.cost, budget_s=args.budget, seed=args.seed,
                  max_proposals=args.max_proposals, progress=not args.json and sys.stderr.isatty())
    path = save_plan(result, args.out, problem.graph, problem.topology, model_options=problem.spec.options)
    dp = result.candidates.get("data-parallel")
    notes = list(getattr(getattr(dp, "strategy", None), "notes", ()))
    if args.plot:
        from autopar.planner.plot import plot_strategy
        from autopar.planner.sim import TaskGraphBuilder, simulate_strategy
        builder = TaskGraphBuilder(problem.graph, problem.topology, problem.cost)
        _, tl, tg = simulate_strategy(builder, result.strategy)
        plot_strategy(args.plot, problem.graph, problem.topology, result.strategy, tl, tg, builder=builder)
    doc = result.to_dict()
    doc["plan_file"] = str(path)
    doc["dtype"] = problem.graph.dtype
    if notes:
        doc["warnings"] = notes
    if args.plot:
        doc["plot"] = args.plot
    for note in notes:
        warn(note)
    if args.json:
        emit_json(doc)
    else:
        print(result.report())
        print(f"plan written to {path}" + (f"; picture in {args.plot}" if args.plot else ""))
    return 0
