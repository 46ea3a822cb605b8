"""autopar: auto-parallelize PyTorch training jobs (FlexFlow's SOAP search with an execution
simulator).  The command line lives in `autopar.cli`; the layers are `autopar.planner`,
`autopar.trainer` and `autopar.operator`."""
