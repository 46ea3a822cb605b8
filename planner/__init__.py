"""autopar's planner: from a PyTorch model and a cluster to the fastest strategy it can find.

Operator graphs traced with torch.fx (`fx_import`), device topologies (`topology`, `presets`),
SOAP configurations and strategies (`strategy`), a cost model (`cost`), the task graph
(`taskgraph`), full and delta execution simulation (`simulator`), and the searches (`search`).
The planner imports neither the trainer nor the operator; see docs/architecture.md.
"""
