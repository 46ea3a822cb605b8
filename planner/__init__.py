"""autopar's planner: from a PyTorch model and a cluster to the fastest strategy it can find.

Its parts, lowest first (each imports only the parts before it; `tests/test_layers.py` checks):

* `ir` — the operator graph traced with torch.fx, regions, SOAP configurations and strategies,
  op kinds, task kernels (FlexFlow sec. 4);
* `hardware` — device topologies, the device catalog, presets, topology files (sec. 3, 8.1);
* `zoo` — the papers' models as plain `nn.Module`s, and `ModelSpec` for a user's own;
* `cost` — how long a task takes: the cost model, the profile cache, the profiler (sec. 5.1);
* `sim` — task graphs and full and delta simulation (sec. 5.1–5.3), peak memory;
* `search` — baselines, OptCNN's dynamic programming, MCMC, exhaustive search (sec. 6);
* `plan_file`, `plot` — a plan written down and drawn; `errors`, `fileio` — shared by all.

Each subpackage's ``__init__`` is its public surface; the trainer and the CLI import only from
those and from the top-level modules.  The planner imports neither the trainer nor the
operator.  See docs/architecture.md.
"""
