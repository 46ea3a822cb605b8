"""autopar's Kubernetes operator (the ParallelTrainingJob CRD, topology discovery, planner and
trainer pods).  Not built yet: only this layer will talk to the Kubernetes API server."""
