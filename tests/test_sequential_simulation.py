"""Repeated looks do not inflate false positives, by simulation (benchmarks/sequential.py).

Synthetic studies, no training, deterministic (the simulations' RNG is seeded per design and shape), driving
`analysis.sequential.run_sequential`: the `take_look` the runner calls after each wave. Designs of 2-5 cells with
`start` 2-3 and `max` 8-12, with normal, heavy-tailed (t, 3 df) and bimodal (seeds that fail to chance or
succeed) data. The full table, with more simulations, is `python -m benchmarks sequential`
(docs/analysis/sequential.md)."""

from __future__ import annotations

import math

import pytest

from benchmarks import sequential as sim

pytestmark = pytest.mark.e2e

SIMS = 50  # per design and shape; pooled over the four designs per shape
DESIGNS = {
    "2x2-8": sim.DESIGNS["2x2-8"],
    "3x3-12": sim.DESIGNS["3x3-12"],
    "5x2-10": sim.SimDesign(
        5, 2, 10, 1, (f"{sim.METRIC}[arm=4] > {sim.METRIC}[arm=0]", f"{sim.METRIC}[arm=2] > {sim.METRIC}[arm=0]")
    ),
    "4x3-12s2": sim.DESIGNS["4x3-12s2"],
}
ALPHA = 0.05


@pytest.mark.parametrize("shape", sim.SHAPES)
def test_under_the_null_claims_are_supported_at_most_alpha_of_the_time(shape):
    rates = {name: sim.simulate(design, shape, SIMS, effect=False)["supported"] for name, design in DESIGNS.items()}
    pooled = sum(rates.values()) / len(rates)
    se = math.sqrt(ALPHA * (1 - ALPHA) / (SIMS * len(rates)))
    # Claims of one study share cells (correlated), so the pooled standard error is larger than this; 2.5 of
    # these covers it. Each design alone is checked loosely (its own error is ~3x larger).
    assert pooled <= ALPHA + 2.5 * se, f"{shape}: supported under the null {pooled:.3f} ({rates})"
    assert max(rates.values()) <= ALPHA + 4 * math.sqrt(ALPHA * (1 - ALPHA) / SIMS), rates


def test_under_an_effect_it_keeps_most_of_the_fixed_designs_power_with_fewer_seeds():
    design = DESIGNS["2x2-8"]
    sequential = sim.simulate(design, "normal", 80, effect=True)
    fixed = sim.simulate(design, "normal", 80, effect=True, fixed=True)
    null = sim.simulate(design, "normal", 50, effect=False)
    assert fixed["seeds_per_cell"] == design.max and fixed["looks"] == 1
    assert sequential["supported"] >= fixed["supported"] - 0.2, (sequential, fixed)
    assert sequential["seeds_per_cell"] < 0.85 * design.max  # stops early when the effect shows
    assert null["seeds_per_cell"] < 0.7 * design.max  # and when it cannot show (futility)
