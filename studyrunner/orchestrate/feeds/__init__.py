"""Studies whose trials are not all known at submit: they arrive while the Tune run goes on, or are chosen
from trials that ran before.

`feed` is the Tune searcher that admits trials as a study brings them; `search` (with `search_optuna` and
`search_storage`) brings an Optuna search's suggestions, `waves` a sequential study's next wave of seeds after
each look (a `tune:` section's tuning runs before any feed: commands/preflight.py). The commands use these; the
feeds use the ledger, the analysis of looks and the tracking store, never the commands.
"""
