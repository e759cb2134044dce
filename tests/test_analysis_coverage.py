"""The claims' verdicts hold their level, and their intervals cover, at the seed counts studies run (2-5 seeds a
cell), on normal, bimodal (seeds that fail to chance or learn, split by the failure rule) and ceiling (accuracies
tied at 1.0) seeds, with one or several cells at a depth.

Synthetic studies with a known truth (benchmarks/coverage.py); no training. Deterministic: the
simulations' RNG is seeded per design and shape. Under no effect, "supported" and "contradicted" are
false positives, at most 0.05 each by design: a case fails when its count is implausible under 0.05
(binomial p < 1e-4), or when the rate pooled over cases exceeds 0.05 by more than Monte-Carlo error.
Shown intervals (nominal 90%: the two one-sided 95% bounds) must hold the truth as often, within error."""

import math

import pytest
from scipy import stats

from benchmarks import coverage

SIMS = 80
# (design, shape): 2-5 seeds; one and two cells at the top depth; 2 and 3 depths
CASES = [
    ("2x2", "normal"),
    ("2x2", "bimodal"),
    ("2+x3", "normal"),
    ("2+x3", "bimodal"),
    ("2+x3", "ceiling"),
    ("3x3", "bimodal"),
    ("2x5", "ceiling"),
    ("3x5", "normal"),
]
SLOW_CASES = [(d, s) for d in coverage.DESIGNS for s in ("normal", "bimodal", "ceiling")]


def _implausible(count: int, n: int, rate: float = 0.05) -> bool:
    """count of n is implausible at `rate`: binomial p < 1e-4 (a test makes 100-300 such checks, so one
    in 30-100 runs would flag a design that holds its level at 1e-3; the pooled check is the strict one)."""
    return stats.binom.sf(count - 1, n, rate) < 1e-4


def _check(rows: dict, where: str, null: bool) -> list[str]:
    problems = []
    for kind, r in rows.items():
        n = r["n"]
        if null:
            for outcome in ("supported", "contradicted"):
                if _implausible(round(r[outcome] * n), n):
                    problems.append(f"{where} {kind}: {outcome} {r[outcome]:.3f} under no effect")
        shown = round((1 - r["undecidable"]) * n) if math.isfinite(r["undecidable"]) else 0
        if shown >= 20 and math.isfinite(r["coverage"]):
            floor = 0.9 - 3 * math.sqrt(0.09 / shown)
            if r["coverage"] < floor:
                problems.append(f"{where} {kind}: coverage {r['coverage']:.3f} < {floor:.3f} ({shown} shown)")
    return problems


def _run(cases, sims):
    problems, pooled = [], {}
    for design, shape in cases:
        null = coverage.simulate(design, shape, sims, null=True)
        problems += _check(null, f"{design} {shape} (no effect)", True)
        for kind, r in null.items():
            got = pooled.setdefault((shape, kind), [0, 0])
            got[0] += round(r["supported"] * r["n"])
            got[1] += r["n"]
        if shape != "bimodal":  # the truth of an effect is the mean's; on bimodal seeds only 0 is checked
            problems += _check(coverage.simulate(design, shape, sims, null=False), f"{design} {shape} (effect)", False)
    for (shape, kind), (count, n) in pooled.items():
        if count / n > 0.05 + 2 * math.sqrt(0.05 * 0.95 / n):
            problems.append(f"{shape} {kind}: supported {count}/{n} under no effect, pooled over designs")
    return problems


@pytest.mark.e2e
def test_claims_hold_their_level_and_intervals_cover():
    problems = _run(CASES, SIMS)
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_claims_hold_their_level_and_intervals_cover_in_every_design(request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("every design: minutes on 2 cores; run with -m slow")
    problems = _run(SLOW_CASES, 200)
    assert not problems, "\n".join(problems)


def test_the_old_bootstrap_did_not_cover_at_two_seeds():
    """Why the intervals are not bootstrapped at a few seeds: the percentile bootstrap of seeds within depths,
    and the [min, max] 'interval' of a 2-seed bootstrap, fall far below their nominal 95%."""
    import numpy as np

    from studyrunner.analysis import fits
    from studyrunner.analysis import stats as st

    rng = np.random.default_rng(0)
    slope_hits, iqm_hits = [], []
    for _ in range(150):
        frame = coverage.sample([1, 4], 2, rng)
        b = fits.fit(frame.effective_depth, frame.y, strata=frame.effective_depth, ci="bootstrap", n_boot=200,
                     extrapolate=False)  # fmt: skip
        lo, hi = b.param_ci["alpha"]
        slope_hits.append(lo <= coverage.SLOPE <= hi)
        one = frame[frame.effective_depth == 1].y.to_numpy()
        lo, hi = st.stratified_bootstrap([one], st.iqm)
        iqm_hits.append(lo <= coverage.BETA <= hi)
    assert np.mean(slope_hits) < 0.8 and np.mean(iqm_hits) < 0.6
