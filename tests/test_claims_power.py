"""The seeds an inconclusive claim's own test needs for 80% power. The closed
forms and enumerations are checked against a simulation of `verify` itself on synthetic studies at the
seeds they name (no training); the figures reach `verify`, `analyze`, the report and the JSON output."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from studyrunner.analysis import claims
from studyrunner.analysis.claims import power
from studyrunner.analysis.data import from_frame
from studyrunner.cli import app

runner = CliRunner()
SIMS = 200
TOLERANCE = 0.085  # 3 Monte-Carlo sd of a power near 0.8 over 200 simulations


def study(values: dict[int, np.ndarray], failed: dict[int, np.ndarray] | None = None, claims_=None):
    """A frame with a cell per depth (loops = D), a column of per-seed values each (seed = position)."""
    rows = []
    for depth, ys in values.items():
        for seed, y in enumerate(ys):
            rows.append(
                {
                    "trial_key": f"D{depth}-s{seed}",
                    "cell_hash": f"D{depth}",
                    "cell": f"loops={depth}",
                    "seed": seed,
                    "status": "failed" if failed is not None and failed[depth][seed] else "succeeded",
                    "model.params.loops": depth,
                    "model.params.block_layers": 1,
                    "effective_depth": float(depth),
                    "baseline": "",
                    "baseline_of": "",
                    "y": float(y),
                }
            )
    return from_frame(pd.DataFrame(rows), metric="y", claims=claims_)


def simulated_power(make, claim: str, n: int, sims: int = SIMS) -> float:
    rng = np.random.default_rng(n)
    return float(np.mean([claims.evaluate(make(n, rng), claim).verdict == "supported" for _ in range(sims)]))


@pytest.mark.e2e
def test_paired_t_closed_form_matches_a_simulation_of_the_test():
    rng = np.random.default_rng(0)
    base = rng.normal(0.5, 0.05, 3)
    observed = study({1: base, 4: base + np.array([0.03, -0.01, 0.04])})
    claim = "y[loops=4] > y[loops=1]"
    v = claims.evaluate(observed, claim)
    assert v.verdict == "inconclusive"
    need = power.seeds_needed(observed, claim)
    assert need.method == "closed form: noncentral t, paired (per-seed differences)"
    d = np.array([0.03, -0.01, 0.04])
    assert need.effect == pytest.approx(d.mean()) and need.spread == pytest.approx(d.std(ddof=1))
    assert "estimate" in need.note and 3 < need.per_side < 100

    def make(n, rng):
        b = rng.normal(0.5, 0.05, n)
        return study({1: b, 4: b + rng.normal(need.effect, need.spread, n)})

    assert simulated_power(make, claim, need.per_side) >= 0.8 - TOLERANCE
    assert simulated_power(make, claim, need.per_side - 2) < 0.8 + TOLERANCE
    # a min_effect: the seeds for that effect instead
    bigger = power.seeds_needed(observed, claim, effect=0.05)
    assert bigger.effect == 0.05 and bigger.per_side < need.per_side


@pytest.mark.e2e
def test_cr2_slope_closed_form_matches_a_simulation_of_the_test():
    depths = (1, 2, 4)
    rng = np.random.default_rng(1)

    def make(n, rng, slope=0.02, sd=0.03):
        u = rng.normal(0, 0.05, n)
        return study({d: 0.4 + slope * math.log(d) + u + rng.normal(0, sd, n) for d in depths})

    observed = make(3, rng)
    claim = "slope(y ~ ln effective_depth) > 0"
    need = power.seeds_needed(observed, claim, effect=0.02)
    assert need.method == "closed form: noncentral t, the CR2 slope test (per-seed slopes)"
    # simulate at the spread the figure assumed: the per-seed slopes' sd is sd_e·√(1 / Sxx) per seed
    x = np.log(depths)
    sd_e = need.spread * math.sqrt(((x - x.mean()) ** 2).sum())
    assert simulated_power(lambda n, rng: make(n, rng, sd=sd_e), claim, need.per_side) >= 0.8 - TOLERANCE
    assert simulated_power(lambda n, rng: make(n, rng, sd=sd_e), claim, need.per_side - 2) < 0.8 + TOLERANCE


@pytest.mark.e2e
def test_fisher_enumeration_matches_a_simulation_of_the_test():
    claim = "failure_rate[loops=4] < failure_rate[loops=1]"
    fails = {1: np.array([True, True, False]), 4: np.array([False, False, False])}
    observed = study({1: np.zeros(3), 4: np.zeros(3)}, fails)
    observed.trials.loc[observed.trials.cell_hash == "D4", "seed"] += 100  # disjoint seeds: Fisher
    v = claims.evaluate(observed, claim)
    assert "Fisher" in v.test and v.verdict == "inconclusive"
    need = power.seeds_needed(observed, claim, effect=0.5)  # rates 2/3 vs 1/6
    assert need.method == "exact enumeration, Fisher" and need.effect == -0.5

    def make(n, rng):
        f = {1: rng.random(n) < 2 / 3, 4: rng.random(n) < 2 / 3 - 0.5}
        s = study({1: np.zeros(n), 4: np.zeros(n)}, f)
        s.trials.loc[s.trials.cell_hash == "D4", "seed"] += 100
        return s

    assert simulated_power(make, claim, need.per_side) >= 0.8 - TOLERANCE
    assert simulated_power(make, claim, need.per_side - 2) < 0.8 + TOLERANCE


def test_mcnemar_and_binomial_enumerations():
    fails = {1: np.array([True, True, False, True]), 4: np.array([False, True, False, False])}
    observed = study({1: np.zeros(4), 4: np.zeros(4)}, fails)
    need = power.seeds_needed(observed, "failure_rate[loops=4] < failure_rate[loops=1]")
    assert need.method == "exact enumeration, McNemar" and need.per_side >= 5  # 0.5^n < 0.05 from 5
    need = power.seeds_needed(observed, "failure_rate[loops=4] < 0.5")  # 1/4 observed
    assert need.method == "exact enumeration, binomial test" and need.effect == pytest.approx(-0.25)
    rate, n = 0.25, need.per_side
    from scipy import stats

    k = np.arange(n + 1)
    p = stats.binom.cdf(k, n, 0.5)
    assert stats.binom.pmf(k, n, rate)[p < 0.05].sum() >= 0.8


def test_an_effect_against_the_claim_needs_no_number_of_seeds():
    observed = study({1: np.array([0.5, 0.6, 0.55]), 4: np.array([0.49, 0.58, 0.56])})
    need = power.seeds_needed(observed, "y[loops=4] > y[loops=1]")
    assert need.per_side is None and "not in the claimed direction" in need.note


def test_randomisation_tests_are_simulated():
    fails = {1: np.array([True, False, True]), 4: np.array([False, False, True])}
    values = {1: np.array([0.25, 0.9, 0.26]), 4: np.array([0.92, 0.95, 0.27])}
    observed = from_frame(study(values, None).trials, metric="y", failure="y < 0.4")
    need = power.seeds_needed(observed, "y[loops=4] > y[loops=1]")
    assert need.method.startswith("simulation of the exact sign-flip test") and need.per_side >= 5
    assert fails  # (the failure rule marks the same seeds)


def test_seeds_needed_reach_verify_json_the_table_and_the_report(tmp_path):
    from analysis_ledger import build, loglinear_outcome

    claims_text = (
        "claims:\n"
        '  - {claim: "eval_accuracy[loops=2, block_layers=1] > eval_accuracy[loops=1, block_layers=1]", '
        "min_effect: 0.2}\n"
        '  - "eval_accuracy[loops=8, block_layers=1] > eval_accuracy[loops=1, block_layers=1]"\n'
    )
    noisy = loglinear_outcome(alpha=0.005, noise=0.05)  # a small effect, 4 seeds: inconclusive
    build(tmp_path, noisy, extra=claims_text)
    result = runner.invoke(app, ["verify", "synth", "--workspace", str(tmp_path), "--format", "json"])
    rows = json.loads(result.stdout)
    first = rows[0]
    assert first["verdict"] == "inconclusive" and first["min_effect"] == 0.2
    assert set(first["seeds_needed"]) == {"observed", "min_effect"}
    assert first["seeds_needed"]["min_effect"]["effect"] == 0.2
    assert first["seeds_needed"]["observed"]["method"].startswith("closed form")
    assert rows[1]["seeds_needed"] is None or rows[1]["verdict"] == "inconclusive"
    result = runner.invoke(app, ["verify", "synth", "--workspace", str(tmp_path)])
    assert "seeds needed for 80% power" in result.output
    result = runner.invoke(app, ["analyze", "synth", "--workspace", str(tmp_path), "--format", "json"])
    assert json.loads(result.stdout)["claims"][0]["seeds_needed"]["min_effect"]["per_side"] >= 2
    result = runner.invoke(app, ["report", "synth", "--workspace", str(tmp_path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    html = next((tmp_path / "r").glob("*.html")).read_text()
    assert "seeds needed for 80% power" in html and "90% interval" in html
