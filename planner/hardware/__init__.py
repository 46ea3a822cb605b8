"""The hardware a plan is made for: devices, the links between them and the routes transfers take.

* `topology` — `DeviceTopology`: compute devices and passive endpoints joined by directed links
  with bandwidth and latency; routes are fastest paths (FlexFlow sec. 3, Figure 2; sec. 5.1
  treats each link as a device that runs transfers in FIFO order);
* `catalog` — the GPUs (and this machine's CPU workers) with their datasheet peaks;
* `presets` — the papers' clusters (sec. 8.1, Figure 6), DGX systems and `local:N`;
* `topology_file` — topology YAML/JSON files, and `resolve_topology` for a preset name or a file.

Hardware depends on nothing else of the planner but its errors and file writing.
"""

from .catalog import LOCAL_CPU, DeviceSpec, known_products, lookup, make_device
from .presets import get_preset, is_preset, list_presets
from .topology import LINK_KINDS, Device, DeviceTopology, Link
from .topology_file import dump_topology, load_topology, parse_topology, resolve_topology, save_topology

__all__ = ["LINK_KINDS", "LOCAL_CPU", "Device", "DeviceSpec", "DeviceTopology", "Link", "dump_topology", "get_preset",
           "is_preset", "known_products", "list_presets", "load_topology", "lookup", "make_device", "parse_topology",
           "resolve_topology", "save_topology"]
