"""The cost model: how long one task of an op takes on a device, forward and backward.

* `model` — `CostModel`: a measured median where the profile cache has one, else the roofline
  estimate of `AnalyticModel` (FlexFlow sec. 5.1, assumption A1; OptCNN sec. 5.1's t_c);
* `profile_cache` — measured times keyed by what decides them (device product, op kind, shard
  shapes, dtype, attributes), persisted as JSON;
* `profiler` — `autopar profile`: runs the distinct tasks of a model's strategies on this
  machine and fills the cache;
* `calibration` — what the trainer costs beyond the kernels (overheads, communication, the
  optimizer), measured by `autopar.trainer.calibrate` and kept in the profile cache.

The cost model reads the IR and the hardware; the simulator and the search read it.
"""

from .calibration import STAGING_PARTS, Curve, RuntimeCalibration, calibration_key, default_calibration, usable_cores
from .model import AnalyticModel, CostModel, Estimate, KindClass, graph_input_shapes, kind_class
from .profile_cache import (CACHE_ENV, ProfileCache, cold_kind, default_cache_path, host_kind, hot_kind, kind_of,
                            task_key)
from .profiler import (ProfileRecord, ProfileReport, bind_to_own_cores, cache_evictor, device_kind_of,
                       engine_overhead, keep_freed_memory, last_level_cache_bytes, lockstep_task, measure_task,
                       profile_items, profile_local, profile_ops, shared_cache_bytes, store_lockstep_passes,
                       use_huge_pages)

__all__ = ["CACHE_ENV", "STAGING_PARTS", "AnalyticModel", "CostModel", "Curve", "Estimate", "KindClass",
           "ProfileCache", "ProfileRecord", "ProfileReport", "RuntimeCalibration", "cache_evictor",
           "calibration_key", "cold_kind", "default_cache_path", "host_kind", "hot_kind", "kind_of",
           "default_calibration",
           "bind_to_own_cores", "device_kind_of", "engine_overhead", "graph_input_shapes", "keep_freed_memory",
           "kind_class", "last_level_cache_bytes", "lockstep_task", "measure_task", "profile_items", "profile_local",
           "profile_ops", "shared_cache_bytes", "store_lockstep_passes", "task_key", "usable_cores",
           "use_huge_pages"]
