"""The planner's intermediate representation: what a model is, and how it may be split.

* `graph` — the operator graph: ops, tensors with named dims, their parallelizable dims
  (FlexFlow sec. 4, Table 1) and the axis maps that say which region of each input and parameter
  a task reads;
* `regions` — boxes (hyper-rectangles) of a tensor and their intersection (sec. 5.1);
* `strategy` — SOAP configurations (a degree per parallelizable dim, a device per task) and
  strategies, with the plain ones (data and model parallelism, one device);
* `fx_import` — torch.fx tracing with fake-tensor shapes into an `OperatorGraph`, through the
  op kinds of `opkinds` (`planner/README.md` is their table);
* `kernels` — one task of an op on local shards: the profiler and the trainer run these.

The IR depends on nothing else of the planner but its errors; every other part builds on it.
"""

from . import kernels
from .fx_import import import_model, import_spec
from .graph import DTYPE_BYTES, AxisMap, DimKind, Op, OperatorGraph, ParamSpec, ParDim, TensorRef, TensorSpec
from .regions import Box, Range, cells, contains, full_box, intersect, translate, volume
from .strategy import (ParallelConfig, Strategy, check_config, data_parallel, degree_choices, enumerate_configs,
                       model_parallel, random_config, single_device)

__all__ = ["DTYPE_BYTES", "AxisMap", "Box", "DimKind", "Op", "OperatorGraph", "ParDim", "ParallelConfig", "ParamSpec",
           "Range", "Strategy", "TensorRef", "TensorSpec", "cells", "check_config", "contains", "data_parallel",
           "degree_choices", "enumerate_configs", "full_box", "import_model", "import_spec", "intersect", "kernels",
           "model_parallel", "random_config", "single_device", "translate", "volume"]
