"""Sequential seeds: a group-sequential design over a study's claims. `spending` holds the alpha-spending
functions and the boundaries they give, `looks` a look's bookkeeping (the design, each claim's state, their
ledger rows) and `stopping` what a look decides (crossing, futility, Holm) and the verdicts read back from the
looks. They are kept apart from `analysis.claims`, whose tests they run at each look's nominal level, because
only a study with `seeds: {start, max}` takes looks, and the runner (orchestrate) drives them wave by wave.
"""

from ..claims.verdict import ALPHA
from .looks import (
    DECIDED,
    FUTILITY_POWER,
    MIN_FUTILITY_SEEDS,
    TERMINAL,
    ClaimLook,
    ClaimState,
    Design,
    Look,
    changed_claim_fields,
    claim_entries,
    claim_row,
    describe_state,
    design_of,
    final_states,
    look_row,
    looks_from_rows,
)
from .spending import GRID_POINTS, SD_RANGE, SPENDING, boundaries, calibrated_alpha, nominal_level, repeated_p, spent
from .stopping import (
    claim_specs,
    claim_test,
    entries_of,
    run_sequential,
    seeds_per_cell,
    take_look,
    verdicts,
    verify,
)

# Two ClaimState members as module names, which orchestrate/feeds/waves.py imports (new code: ClaimState).

__all__ = [
    "ALPHA", "DECIDED", "FUTILITY_POWER", "GRID_POINTS",
    "MIN_FUTILITY_SEEDS", "SD_RANGE", "SPENDING", "TERMINAL", "ClaimLook", "ClaimState", "Design", "Look",
    "boundaries", "calibrated_alpha", "changed_claim_fields", "claim_entries", "claim_row", "claim_specs",
    "claim_test", "describe_state", "design_of", "entries_of", "final_states", "look_row", "looks_from_rows",
    "nominal_level", "repeated_p", "run_sequential", "seeds_per_cell", "spent", "take_look", "verdicts", "verify",
]  # fmt: skip
