"""Deciding a study's declared claims: `decide` parses each claim and sends it to the test of its quantity
(`location`, `slope`, `failure`, on the per-seed evidence `evidence` gathers, falling back to the exact
randomisation tests of `exact` and the distribution-free gate of `bounded`), `verdict` holds what they return,
`power` how many seeds a claim's test needs and `validity` the threats that would make a verdict about the
set-up. They are one group because every module here answers the same question, whether the seeds support a
claim, and they share its verdict and its level; the sequential looks (`analysis.sequential`) call into them.
"""

from .decide import FEW_SEEDS, adjust_holm, evaluate, flat, verdict_table, verify
from .verdict import ALPHA, Verdict, VerdictKind

__all__ = [
    "ALPHA", "FEW_SEEDS", "Verdict", "VerdictKind",
    "adjust_holm", "evaluate", "flat", "verdict_table", "verify",
]  # fmt: skip
