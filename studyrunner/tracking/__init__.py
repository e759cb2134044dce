"""MLflow, in one place: every module that talks to an MLflow tracking store or links into its UI.

One experiment per study, a parent run per cell and a child run per trial (`tracker`); calls that never stop a
study while a server comes and goes (`guard`); what MLflow lacks mended from the ledger and the curves (`sync`,
and `study_runs` around each command's Tune run); a cell's seed aggregates as seeds finish (`aggregates`); a
bound on how long an HTTP call may take (`http`); links into the MLflow UI and the study-level run
(`ui_links`), and the `studyrunner ui` server (`ui_server`).

It sits below `orchestrate` and `analysis`, which both record to MLflow or link into it, and reads only the
ledger, the curves, the trials' checkpoints and study files: it never imports `orchestrate`, `analysis` or
`cli`, so either side can use it without a cycle. Importing this package loads nothing (MLflow is imported
inside the functions that need it, so `studyrunner --help` stays fast).
"""
