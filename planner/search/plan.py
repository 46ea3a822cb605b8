"""`plan`: find the fastest strategy the simulator can show, and never return a worse one than
a baseline it evaluated.

    result = plan(graph, topology, CostModel(), budget_s=30, seed=0)
    result.strategy, result.step_time, result.candidates["data-parallel"].step_time

Steps (FlexFlow sec. 6 and 8):

1. Simulate the baselines — data parallelism, model parallelism, the expert strategy where one
   applies — with full simulation, and their peak memory per device.
2. OptCNN's dynamic programming (`optcnn`), then simulate its strategy.
3. The placement-only search: MCMC restricted to the operation dimension (REINFORCE's space)
   from a single device and from the layer-per-GPU placement.
4. MCMC over the SOAP space from several starts (default: data parallelism, the expert strategy,
   OptCNN's result, OptCNN's result with one block of devices per recurrent layer and the ops
   around each layer alongside it (`layer_blocks`, RNNs only: FlexFlow 8.5's NMT strategy; the
   fastest of that, the layers alone and two layers to a block twice as large), for CNNs with
   modules of branches data parallelism with each module's branches on blocks of a node's GPUs
   (`branches`, FlexFlow 8.5's Inception-v3 strategy; the fastest of the balanced placements
   and every branch on one GPU) and a random strategy), slowest start first, each with a share of what is
   left of `budget_s` that doubles from one start to the next faster one (four starts: 1/15,
   2/15, 4/15, 8/15); time a chain does not use passes to the ones after it.  Equal shares
   spent a quarter of nmt's budget walking down from a random strategy 4x slower than OptCNN's.
   A random start whose task graph would be over 10x data parallelism's (most of them at 64
   GPUs) is not run, and the chain list says so.  A chain stops once it has gone half its share
   without improving, so the last one can leave time over: that goes to restarts, new chains
   from the best strategy found so far ("restart from <start>" in the chain list).  The last
   start's chain and the restarts stop early only when what they leave is enough for another
   restart (`MIN_RESTART_SECONDS`, a tenth of the first restart's time); otherwise they run to
   the end of their share.  (With 4 s of MCMC on inception_v3 at 16 GPUs the branches chain
   used to stop after 1.6 s and leave 1.4 s that no restart could take.)
5. The answer is the fastest candidate that fits in memory, re-simulated from scratch (full
   simulation) so the reported time is never a delta artefact.  Every candidate's step holds
   the all-reduce of the step's loss that ends a trained step (`planner.sim.loss_allreduce_s`,
   where the runtime is calibrated), so the plan file records what `autopar train` measures.  When nothing beats data
   parallelism, the result is data parallelism and `note` says so.  When nothing fits, an
   `OutOfMemoryError` says by how much.
"""

from __future__ import annotations

import math
import random
import sys
import time

from ..cost.model import CostModel
from ..errors import OutOfMemoryError, StrategyError
from ..hardware.topology import DeviceTopology
from ..ir.graph import OperatorGraph
from ..ir.strategy import Strategy, random_config, single_device
from ..sim.evaluate import simulate_strategy
from ..sim.gc_regime import frozen_heap
from ..sim.memory import check_fits
from ..sim.taskgraph import OPTIMIZER_STATES, DeltaSession, TaskGraphBuilder
from ..sim.trainer_model import loss_allreduce_s
from ..sim.waits import has_arrival_noise
from . import experts
from ._estimate import estimate_tasks
from ._memtrack import MemoryTracker
from ._result import Candidate, PlanResult, _bytes
from .branches import balanced_branches, branch_placement
from .mcmc import DEFAULT_BETA_REL, ChainResult, SoapSpace, run_chain
from .optcnn import OptCNNResult, optcnn

DEFAULT_STARTS = ("data-parallel", "expert", "optcnn", "layer-blocks", "branches", "random")
BASELINES = ("data-parallel", "model-parallel", "expert")
MIN_RESTART_SECONDS = 2.0  # leftover MCMC budget below this is not worth a new chain
CANDIDATES = ("data-parallel", "model-parallel", "expert", "placement", "optcnn", "mcmc")


def plan(graph: OperatorGraph, topology: DeviceTopology, cost: CostModel | None = None, *,
         budget_s: float = 30.0, seed: int = 0, starts: tuple[str, ...] = DEFAULT_STARTS,
         placement_budget_s: float | None = None, use_optcnn: bool = True, max_proposals: int | None = None,
         beta_rel: float = DEFAULT_BETA_REL, max_tasks: int | None = None, progress: bool = False) -> PlanResult:
    """Search for the fastest strategy of `graph` on `topology` (see the module docstring).

    `budget_s` is MCMC's time, shared by `starts`; the placement-only search gets
    `placement_budget_s` (default a quarter of `budget_s`).  `max_proposals` bounds every chain
    by count instead of time, for bit-reproducible results.  `max_tasks` skips simulating a
    baseline whose task graph would have more tasks (it is reported as not simulated).
    `progress` draws a rich progress bar on stderr when it is a terminal.
    """
    t_all = time.perf_counter()
    cost = cost if cost is not None else CostModel()
    builder = TaskGraphBuilder(graph, topology, cost)
    n = topology.num_devices
    placement_budget_s = budget_s / 4 if placement_budget_s is None else placement_budget_s
    cands: dict[str, Candidate] = {}
    sessions: dict[str, tuple] = {}  # delta sessions of evaluated starts, reused by their chains
    ui = _Progress(progress)
    with ui, frozen_heap():
        for name in BASELINES:
            ui.phase(f"simulating {name}")
            cands[name] = _evaluate(builder, name, lambda nm=name: experts.RULES[nm][0](graph, topology).renamed(nm),
                                    keep=sessions if name in starts else None, max_tasks=max_tasks)

        oc: OptCNNResult | None = None
        if use_optcnn:
            ui.phase("OptCNN dynamic programming")
            t0 = time.perf_counter()
            try:
                oc = optcnn(graph, topology, cost)
            except StrategyError as e:
                cands["optcnn"] = Candidate("optcnn", None, None, None, False, time.perf_counter() - t0, str(e))
            else:
                cands["optcnn"] = _evaluate(builder, "optcnn", lambda: oc.strategy, seconds=oc.seconds,
                                            keep=sessions if "optcnn" in starts else None)

        oc_cand = cands.get("optcnn")
        if "layer-blocks" in starts and oc_cand is not None and oc_cand.strategy is not None:
            ui.phase("simulating OptCNN's strategy with one block per recurrent layer")
            blocks = _layer_blocks(builder, oc_cand.strategy, sessions, max_tasks)
            if blocks is not None:
                cands["layer-blocks"] = blocks

        if "branches" in starts and cands.get("data-parallel") is not None and cands["data-parallel"].strategy is not None:
            ui.phase("simulating data parallelism with the branches of each module side by side")
            side = _branches(builder, cands["data-parallel"].strategy, sessions, max_tasks)
            if side is not None:
                cands["branches"] = side

        chains: list[ChainResult] = []
        t0 = time.perf_counter()
        p_chains = placement_chains(builder, budget_s=placement_budget_s, seed=seed, beta_rel=beta_rel,
                                    max_proposals=max_proposals, ui=ui)
        chains += p_chains
        cands["placement"] = _best_of_chains(builder, "placement", p_chains, time.perf_counter() - t0, cands)

        t0 = time.perf_counter()
        s_chains = []
        # Worst start first, best last; a chain that stops early (no improvement for half its
        # budget) leaves its time to the chains after it, so the most promising start gets most.
        ordered = []
        for k, name in enumerate(starts):
            start = _start(name, graph, n, cands, seed, k)
            skip = _too_big_to_start(builder, name, start, cands)
            if skip:
                s_chains.append(ChainResult(name, "soap", math.nan, None, math.inf, stopped=skip))
                continue
            if start is not None:
                known = cands.get(name)
                ordered.append((known.step_time if known is not None and known.step_time else math.inf, k, name, start))
        ordered.sort(key=lambda x: (-x[0], x[1]))
        weights = [2.0 ** idx for idx in range(len(ordered))]
        for idx, (_, k, name, start) in enumerate(ordered):
            left = budget_s - (time.perf_counter() - t0)
            share = max(left, 0.0) * weights[idx] / sum(weights[idx:])
            session, memory = sessions.pop(name, (None, None))
            # What a chain leaves goes to the next start; the last one's only to a restart.
            handover = 0.0 if idx < len(ordered) - 1 else MIN_RESTART_SECONDS
            s_chains.append(run_chain(builder, start.renamed(name), budget_s=share,
                                      rng=random.Random(f"{seed}:soap:{k}:{name}"), space=SoapSpace(n),
                                      beta_rel=beta_rel, max_proposals=max_proposals, session=session,
                                      memory=memory, on_progress=ui.chain(f"MCMC from {name}"),
                                      min_handover_s=handover))
        sessions.clear()
        s_chains += _restarts(builder, s_chains, budget_s - (time.perf_counter() - t0), seed=seed,
                              beta_rel=beta_rel, max_proposals=max_proposals, ui=ui)
        chains += s_chains
        ui.phase("verifying the best strategy with full simulation")
        best_chain = _best_of_chains(builder, "mcmc", s_chains, time.perf_counter() - t0, cands)

    # Never worse than anything evaluated: the MCMC answer is the best of every candidate.
    pool = [c for c in cands.values() if c.step_time is not None and c.fits]
    if best_chain.step_time is not None and best_chain.fits:
        pool.append(best_chain)
    if not pool:
        raise OutOfMemoryError(_oom_message(builder, cands, best_chain))
    winner = min(pool, key=lambda c: (c.step_time, c.name != "data-parallel"))
    note = ""
    dp = cands["data-parallel"]
    if dp.step_time is not None and dp.fits and winner.step_time >= dp.step_time:
        winner = dp
        note = "no strategy found beats data parallelism; the plan is data parallelism"
    elif dp.step_time is not None and not dp.fits:
        note = "data parallelism does not fit in memory; " + "; ".join(check_fits(builder, dp.strategy, dp.peak_memory))
    source = winner.name if winner is not best_chain else f"mcmc ({best_chain.note})"
    cands["mcmc"] = Candidate("mcmc", winner.strategy, winner.step_time, winner.peak_memory, True,
                              best_chain.seconds, source)
    settings = {"budget_s": budget_s, "placement_budget_s": placement_budget_s, "seed": seed,
                "starts": list(starts), "beta_rel": beta_rel, "max_proposals": max_proposals,
                "optimizer": builder.optimizer, "cost_model": cost.stats()}
    return PlanResult(graph.name, topology.name, graph.fingerprint, topology.fingerprint, n,
                      winner.strategy.renamed("plan"), winner.step_time, source, winner.peak_memory, cands,
                      tuple(chains), oc, time.perf_counter() - t_all, settings, note,
                      {d.id: d.memory for d in topology.devices})


def placement_chains(builder: TaskGraphBuilder, *, budget_s: float, seed: int = 0,
                     beta_rel: float = DEFAULT_BETA_REL, max_proposals: int | None = None, ui=None) -> list[ChainResult]:
    """REINFORCE's space searched by MCMC: every op whole on one device, starting from a single
    device and from the layer-per-GPU placement, `budget_s` split between the two."""
    graph, topology = builder.graph, builder.topology
    starts = [("single-device", single_device(graph, 0)),
              ("layer-placement", experts.layer_placement(graph, topology))]
    out = []
    for name, start in starts:
        out.append(run_chain(builder, start.renamed(name), budget_s=budget_s / len(starts),
                             rng=random.Random(f"{seed}:placement:{name}"),
                             space=experts.PlacementSpace(topology.num_devices), beta_rel=beta_rel,
                             max_proposals=max_proposals,
                             on_progress=ui.chain(f"placement from {name}") if ui is not None else None))
    return out


def placement_strategy(graph: OperatorGraph, topology: DeviceTopology, proposals: int = 400) -> Strategy:
    """The placement-only baseline as a named strategy: a fixed number of proposals per chain
    (so the same graph and topology always give the same strategy)."""
    builder = TaskGraphBuilder(graph, topology, CostModel())
    chains = [c for c in placement_chains(builder, budget_s=math.inf, max_proposals=proposals) if c.best is not None]
    if not chains:
        raise StrategyError(f"placement: no placement of {graph.name} on {topology.name} fits in memory")
    return min(chains, key=lambda c: c.best_time).best.renamed("placement")


# -- pieces ------------------------------------------------------------------------------------

def _restarts(builder: TaskGraphBuilder, chains: list[ChainResult], left_s: float, *, seed: int,
              beta_rel: float, max_proposals: int | None, ui) -> list[ChainResult]:
    """Spend what the chains left of the budget (each stops after going half its share without
    improving) on new chains from the best strategy found so far, each with all the time left
    and a seed of its own, until less than `MIN_RESTART_SECONDS` or a tenth of the first
    restart's time remains (a restart stops early only when it would leave at least that much,
    so no time is left unused).  Counted searches (`max_proposals`) have no time to spend."""
    out: list[ChainResult] = []
    if max_proposals is not None or not math.isfinite(left_s):
        return out
    t0 = time.perf_counter()
    floor = max(MIN_RESTART_SECONDS, left_s / 10)
    n = 0
    while True:
        left = left_s - (time.perf_counter() - t0)
        found = [c for c in chains + out if c.best is not None]
        if left < floor or not found:
            return out
        best = min(found, key=lambda c: c.best_time)
        origin = best.start.removeprefix("restart from ")
        n += 1
        out.append(run_chain(builder, best.best.renamed(f"restart from {origin}"), budget_s=left,
                             rng=random.Random(f"{seed}:restart:{n}"), space=SoapSpace(builder.num_devices),
                             beta_rel=beta_rel, on_progress=ui.chain(f"MCMC restart {n} from the best so far"),
                             min_handover_s=floor))


def _layer_blocks(builder: TaskGraphBuilder, base: Strategy, sessions: dict, max_tasks: int | None) -> Candidate | None:
    """`experts.layer_blocks` of `base` with and without the ops around the layers, and with
    two layers to a block twice as large: the faster (see `_fastest`), or None when the graph
    has no recurrent layers to spread."""
    g, topo = builder.graph, builder.topology
    return _fastest(builder, "layer-blocks", [
        (experts.layer_blocks(g, topo, base, neighbours=True),
         "recurrent layers on blocks of their own, the ops around them alongside"),
        (experts.layer_blocks(g, topo, base, neighbours=False), "recurrent layers on blocks of their own"),
        (experts.layer_blocks(g, topo, base, neighbours=False, share=2),
         "recurrent layers two to a block of twice the size")],
        sessions, max_tasks)


#: The plan tries `balanced_branches` with each of `BRANCH_ALPHAS` (network seconds weighed
#: against compute seconds) and `branch_placement` with each of `BRANCH_SPREADS`, and starts
#: from the fastest.  On inception_v3, `p100-4x4`: alpha 0.5 / 1 / 2 give 40.0 / 39.3 / 41.6 ms,
#: every branch on one GPU 52.7; `k80-16x4`: every branch on one GPU 128.9 ms, alpha 2 129.8.
BRANCH_ALPHAS = (0.5, 1.0, 2.0)
BRANCH_SPREADS = (math.inf,)


def _branches(builder: TaskGraphBuilder, base: Strategy, sessions: dict, max_tasks: int | None) -> Candidate | None:
    """`balanced_branches` and `branch_placement` of `base` (see `BRANCH_ALPHAS`): the fastest
    (see `_fastest`), or None when the graph has no modules of branches or the topology one node."""
    variants = [(balanced_branches(builder, base, alpha),
                 f"each module's branches on blocks of a node's GPUs, balanced (network weighed {alpha:g}x)")
                for alpha in BRANCH_ALPHAS]
    variants += [(branch_placement(builder, base, spread), f"each module's branches side by side on a node's GPUs"
                                                           f"{'' if spread == math.inf else f', those over {spread:g}x their share spread'}")
                 for spread in BRANCH_SPREADS]
    return _fastest(builder, "branches", variants, sessions, max_tasks)


def _fastest(builder: TaskGraphBuilder, name: str, variants: list, sessions: dict, max_tasks: int | None) -> Candidate | None:
    """Simulate each (strategy, note) of `variants` (None strategies skipped, repeats simulated
    once) and return the fastest that fits as candidate `name`, its delta session into
    `sessions`; None when no variant applies."""
    found = []
    seen = []
    for strategy, note in variants:
        if strategy is None or strategy.configs in seen:
            continue
        seen.append(strategy.configs)
        kept: dict = {}
        c = _evaluate(builder, name, lambda s=strategy: s.renamed(name), keep=kept, max_tasks=max_tasks)
        found.append((Candidate(c.name, c.strategy, c.step_time, c.peak_memory, c.fits, c.seconds, c.note or note), kept))
    if not found:
        return None
    best, kept = min(found, key=lambda f: (not f[0].fits, f[0].step_time if f[0].step_time is not None else math.inf))
    sessions.update(kept)
    return best


def _evaluate(builder: TaskGraphBuilder, name: str, build, seconds: float | None = None,
              keep: dict | None = None, max_tasks: int | None = None) -> Candidate:
    """Simulate a strategy from scratch.  With `keep`, the delta session and memory tracker that
    did it are stored there for the chain that starts from it."""
    t0 = time.perf_counter()
    try:
        strategy = build()
    except StrategyError as e:
        return Candidate(name, None, None, None, False, time.perf_counter() - t0, str(e))
    if max_tasks is not None:
        estimate = estimate_tasks(builder, strategy, limit=max_tasks)
        if estimate > max_tasks:
            return Candidate(name, strategy, None, None, False, time.perf_counter() - t0,
                             f"not simulated: its task graph would have over {estimate:,} tasks, above the limit "
                             f"of {max_tasks:,} of this run")
    if keep is None:
        res, _, _ = simulate_strategy(builder, strategy)
        step, peak = res.step_time, res.peak_memory
        fits = not check_fits(builder, strategy, peak)
    else:
        session, memory = DeltaSession(builder, strategy), MemoryTracker(builder, strategy)
        step, peak, fits = session.step_time, memory.peak(), memory.fits()
        keep[name] = (session, memory)
        if has_arrival_noise(builder):
            # The session times mean arrivals, as the chain will; the candidates are compared as
            # every command reports a step, with each wait at its mean (`planner.sim.waits`).
            step = simulate_strategy(builder, strategy)[0].step_time
    step += loss_allreduce_s(builder)        # the same for every strategy: it ranks them as the chains do
    return Candidate(name, strategy, step, peak, fits, seconds if seconds is not None else time.perf_counter() - t0)


def _best_of_chains(builder: TaskGraphBuilder, name: str, chains: list[ChainResult], seconds: float,
                    known: dict[str, Candidate]) -> Candidate:
    """The best strategy the chains found, simulated in full — unless it is a candidate that was
    (a chain that never improved on its start): then that full simulation's numbers stand."""
    found = [c for c in chains if c.best is not None]
    if not found:
        return Candidate(name, None, None, None, False, seconds, "no chain found a strategy that fits")
    best = min(found, key=lambda c: c.best_time)
    same = next((c for c in known.values() if c.step_time is not None and c.strategy is not None
                 and c.strategy.configs == best.best.configs), None)
    if same is not None:
        return Candidate(name, best.best, same.step_time, same.peak_memory, same.fits, seconds,
                         f"from {best.start}")
    cand = _evaluate(builder, name, lambda: best.best, seconds=seconds)
    return Candidate(cand.name, cand.strategy, cand.step_time, cand.peak_memory, cand.fits, seconds,
                     f"from {best.start}")


#: A random start whose task graph would be this many times larger than data parallelism's is
#: not run: at 64 GPUs a random strategy has 40-70x DP's tasks (millions), its build alone takes
#: tens of seconds and the chain gets through a handful of proposals.
MAX_RANDOM_START_TASKS_RATIO = 10


def _too_big_to_start(builder: TaskGraphBuilder, name: str, start: Strategy | None,
                      cands: dict[str, Candidate]) -> str:
    """Why a random start is not worth a chain here ('' when it is)."""
    dp = cands.get("data-parallel")
    if name != "random" or start is None or dp is None or dp.strategy is None:
        return ""
    ref = estimate_tasks(builder, dp.strategy)
    est = estimate_tasks(builder, start, limit=MAX_RANDOM_START_TASKS_RATIO * ref)
    if est <= MAX_RANDOM_START_TASKS_RATIO * ref:
        return ""
    return (f"not run: the random start's task graph would have over {est:,} tasks, more than "
            f"{MAX_RANDOM_START_TASKS_RATIO}x data parallelism's {ref:,}; its budget went to the other starts")


def _start(name: str, graph: OperatorGraph, n: int, cands: dict[str, Candidate], seed: int, k: int) -> Strategy | None:
    if name == "random":
        rng = random.Random(f"{seed}:random-start:{k}")
        return Strategy.from_mapping(graph, {op.name: random_config(op, n, rng) for op in graph.ops}, "random")
    c = cands.get(name)
    if c is not None:
        return c.strategy
    if name in ("layer-blocks", "branches"):
        return None  # no recurrent layers to spread or modules of branches (or OptCNN did not run)
    raise StrategyError(f"unknown MCMC start {name!r}; starts are named candidates "
                        f"({', '.join(k for k in cands)}) or 'random'")


def _oom_message(builder: TaskGraphBuilder, cands: dict[str, Candidate], best_chain: Candidate) -> str:
    g, topo = builder.graph, builder.topology
    factor = 2 + OPTIMIZER_STATES[builder.optimizer]
    need = factor * g.param_bytes + sum(o.nbytes for op in g.ops for o in op.outputs)
    have = sum(d.memory for d in topo.devices)
    if need > have:
        return (f"{g.name} fits on {topo.name} under no strategy: parameters, gradients and optimizer state "
                f"({factor} x {_bytes(g.param_bytes)}) plus one copy of every activation need "
                f"{_bytes(need)}, but the {topo.num_devices} devices hold {_bytes(have)} together "
                f"({_bytes(need - have)} short); use more devices or a smaller batch")
    tried = [c for c in list(cands.values()) + [best_chain] if c.peak_memory]
    if not tried:
        return (f"no strategy for {g.name} on {topo.name} could be evaluated: "
                + "; ".join(f"{c.name}: {c.note}" for c in cands.values() if c.note)[:600])
    closest = min(tried, key=lambda c: sum(max(0, m - topo.devices[d].memory) for d, m in c.peak_memory.items()))
    msgs = check_fits(builder, closest.strategy, closest.peak_memory)
    return (f"no strategy found for {g.name} on {topo.name} fits in memory; the closest, {closest.name}: "
            + "; ".join(msgs[:4]) + ("; ..." if len(msgs) > 4 else "")
            + ". Use more devices, devices with more memory or a smaller batch")


class _Progress:
    """A rich progress bar on a terminal (stderr); nothing otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self._progress = None
        self._task = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task("planning", total=None)
        return self

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
        return False

    def phase(self, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=text, total=None)

    def chain(self, label: str):
        if self._progress is None:
            return None
        progress, task = self._progress, self._task

        def report(elapsed: float, best: float) -> None:
            shown = f"{best * 1e3:.3f} ms" if math.isfinite(best) else "none fits yet"
            progress.update(task, description=f"{label}: best {shown}", completed=elapsed, total=None)
        return report
