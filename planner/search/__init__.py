"""Searching the SOAP space (FlexFlow sec. 6, OptCNN sec. 5).

* `plan` — the planner: baselines, OptCNN, the placement-only search and MCMC from several
  starts, with a result never slower than any baseline it evaluated (`planner.search.plan`);
* `optcnn` — OptCNN's node/edge elimination dynamic programming (`planner.search.optcnn`);
* `run_chain` — one Metropolis–Hastings chain with delta simulation (`planner.search.mcmc`);
* `exhaustive_search` — depth-first search with lower-bound pruning (`planner.search.exhaustive`);
* `expert`, `expert_cnn`, `expert_rnn`, `PlacementSpace` — expert strategies and REINFORCE's
  placement-only space (`planner.search.experts`);
* `named_strategy`, `list_named` — the baselines by name (`planner.search.named`);
* `change_tasks`, `MAX_CHANGE_RATIO` — how many link placements a change would build, and the
  ratio above which MCMC rejects it unbuilt (`planner.search._estimate`, `planner.search.mcmc`);
* `run_search_bench`, `bench_table` — `autopar bench search` (`planner.search.bench`).
"""

from ._estimate import change_tasks
from .bench import bench_table, run_search_bench
from .exhaustive import ExhaustiveResult, exhaustive_search
from .experts import PlacementSpace, expert, expert_cnn, expert_rnn, layer_placement
from .mcmc import MAX_CHANGE_RATIO, ChainResult, SoapSpace, accept, run_chain
from .named import list_named, named_strategy
from .optcnn import OptCNNResult, optcnn, optcnn_cost
from .plan import Candidate, PlanResult, plan

__all__ = ["MAX_CHANGE_RATIO", "Candidate", "ChainResult", "ExhaustiveResult", "OptCNNResult", "PlacementSpace",
           "PlanResult", "SoapSpace", "accept", "bench_table", "change_tasks", "exhaustive_search", "expert",
           "expert_cnn", "expert_rnn", "layer_placement", "list_named", "named_strategy", "optcnn", "optcnn_cost",
           "plan", "run_chain", "run_search_bench"]
