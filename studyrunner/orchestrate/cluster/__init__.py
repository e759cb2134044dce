"""The Ray side: starting or joining Ray, one Ray Tune run over a study's trials, and the trial processes.

Driver side: `ray_runtime` (the embedded or joined Ray), `capacity` (what fits the cluster), `warm_workers`,
`tune_fit` (the Tuner and each trial's payload) and its callbacks `recorder` (ledger, MLflow, Parquet) and
`progress`, on the base classes of `driver_callback`; `faults` reads the fault-injection settings. Worker side:
`trainable` (what Tune calls), `attempt` (one attempt of a trial) and `distributed` (a DeepSpeed trial on Ray
Train). Named `cluster`, not `ray`, so that nothing here can be mistaken for the `ray` package.

Every Ray worker imports `studyrunner.orchestrate.cluster.trainable` (Ray's `preload_python_modules`), so this
package's `__init__` imports nothing: a worker loads the trainer and what it needs, not the driver's side.
"""
