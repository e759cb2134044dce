"""The commands' flow: `submit`, `resume`, `rerun` and `cancel` from the study file to the trials that run.

`runner` reads as the narrative of each command over one `StudyRun` (`study_run`), the object that owns one
study's run: its stores, its lease, its feed (the study file's trials, a search's suggestions, a sequential
study's waves) and its result, walked through named steps. `preflight` checks settings and stores before anything
is written, and `selection` says which trials a `rerun` picks. These modules decide what runs; they call
`cluster` to run it on Ray and `feeds` for trials that arrive while it runs, and nothing below calls back up
into them.
"""
