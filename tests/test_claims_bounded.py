"""The distribution-free gate on an accuracy against a number (analysis/claims/bounded.py): a failure mode no seed
has shown yet.

Seeds that fail to chance or succeed: when every seed so far succeeded, the one-sample t-test sees one mode and
decides on it. On a metric with a known range the claim also needs the betting test, valid on any distribution
there and at every look. A mean of a metric of no known range against a number is not decided at all (no test of a
mean holds on skewed seeds without a bound: claims.location.no_range)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from studyrunner.analysis import claims as claims_mod
from studyrunner.analysis import sequential
from studyrunner.analysis.claims import bounded
from studyrunner.analysis.data import StudyData, annotate

# A cell's resolved config as the ledger holds it: the task declares its metrics' ranges (tasks/levels.py).
MQAR = {"task": {"name": "mqar", "params": {}}, "eval": {"examples": 64}}
CHARLM = {"task": {"name": "charlm", "params": {}}, "eval": {"examples": 64}}


def _ranged(data: StudyData, config: dict = MQAR) -> StudyData:
    data.cell_configs = dict.fromkeys(data.trials.cell_hash.unique(), config)
    return data


def test_ranges_come_from_the_cells_tasks_never_from_the_metric_name():
    data = _study([0.5], "eval_accuracy")  # every cell runs mqar
    for name in ("eval_accuracy", "eval_exact_match", "eval_exact_match_budget_2", "eval_accuracy_loops_8"):
        assert bounded.range_of(data, name) == (0.0, 1.0), name
    # a loss is unbounded above (no distribution-free bound), a summary on another scale and a metric no task
    # declares have none
    for name in ("eval_loss", "eval_loss_budget_4_front_rho", "score", "eval_accuracy_rho", "eval_accuracy_spread"):
        assert bounded.range_of(data, name) is None, name
    unknown = _study([0.5], "eval_accuracy")
    unknown.cell_configs = {}
    assert bounded.range_of(unknown, "eval_accuracy") is None  # no cell's task known: no range
    assert bounded.range_of(_ranged(_study([0.5], "eval_bpc"), CHARLM), "eval_bpc") is None  # [0, inf)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # t on identical prefixes: scipy says so
def test_the_betting_p_holds_its_level_at_every_look_on_the_least_favourable_null():
    """Two-point seeds (fail at 0 or succeed at 0.95) whose mean is exactly c: the share of sequences whose p
    falls to 0.05 at ANY of 12 looks stays below 0.05 (Ville's inequality), where the t-test's does not."""
    rng = np.random.default_rng(7)
    q, high, n, sims = 0.3, 0.95, 12, 4000
    c = (1 - q) * high
    x = np.where(rng.random((sims, n)) < q, 0.0, high)
    anytime = np.mean([bounded.betting_p(row, c, True, 0.0, 1.0) <= 0.05 for row in x])
    assert anytime <= 0.05
    with np.errstate(divide="ignore", invalid="ignore"):
        t_any = np.mean(
            [
                any(sps.ttest_1samp(row[:k], c, alternative="greater").pvalue < 0.05 for k in range(3, n + 1))
                for row in x[:1000]
            ]
        )
    assert t_any > 0.1  # all-success prefixes: the t-test alone is fooled by the mode it has not seen


def test_the_bound_inverts_the_p_value():
    x = np.array([0.58, 0.62, 0.57, 0.61])
    lo, hi = bounded.betting_bound(x, 0.05, True, 0, 1), bounded.betting_bound(x, 0.05, False, 0, 1)
    assert lo < x.mean() < hi
    assert bounded.betting_p(x, lo - 1e-6, True, 0, 1) <= 0.05 < bounded.betting_p(x, lo + 1e-3, True, 0, 1)
    assert bounded.betting_p(x, hi + 1e-6, False, 0, 1) <= 0.05 < bounded.betting_p(x, hi - 1e-3, False, 0, 1)
    assert bounded.betting_p(x, 1.5, False, 0, 1) == 0.0  # an accuracy is below 1.5 by construction


def _study(values: list[float], metric: str) -> StudyData:
    rows = [
        {"trial_key": f"c-s{s}", "cell_hash": "c", "cell": "loops=4", "seed": s, "status": "succeeded",
         "model.params.loops": 4, "effective_depth": 4.0, "baseline_of": "", metric: y}
        for s, y in enumerate(values)
    ]  # fmt: skip
    return _ranged(StudyData("s", annotate(pd.DataFrame(rows), None), metric=metric, cells_order=["c"]))


SUCCESSES = [0.95, 0.97, 0.94, 0.96, 0.95]  # every seed in the success mode so far


@pytest.mark.parametrize("metric", ["eval_accuracy", "score"])
def test_a_hidden_failure_mode_holds_back_an_accuracy_and_a_metric_of_no_known_range_is_not_decided(metric):
    v = claims_mod.evaluate(_study(SUCCESSES, metric), f"{metric}[loops=4] > 0.74")
    assert v.verdict == "inconclusive", v
    if metric == "eval_accuracy":
        assert v.extra["gate"]["t_claimed"] < 0.001 and v.p == v.extra["gate"]["claimed"] > 0.05
        assert "held back by the distribution-free bound" in v.detail and v.lo < 0 < v.hi  # the interval agrees
    else:  # before: supported by the one-sample t alone, which called skewed nulls supported 19-28% of the time
        assert "no known range" in v.detail and "median(score)" in v.detail and not np.isfinite(v.p)


def test_far_from_the_number_an_accuracy_is_decided_as_before():
    v = claims_mod.evaluate(_study([0.58, 0.62, 0.57, 0.61], "eval_accuracy"), "eval_accuracy[loops=4] > 0.25")
    assert v.verdict == "supported" and v.p < 0.05 and v.lo > 0
    v = claims_mod.evaluate(_study([0.58, 0.62, 0.57, 0.61], "eval_accuracy"), "eval_accuracy[loops=4] > 0.9")
    assert v.verdict == "contradicted"


def test_a_sequential_look_holds_back_a_crossing_the_gate_does_not_pass():
    design = sequential.Design(3, 8, 1)
    spec = [("score[loops=4] > 0.6", None)]
    looks = [sequential.take_look(_study(SUCCESSES[:3], "score"), design, [], specs=spec)]
    assert looks[0].claims[0].state == "futile"  # no known range: no test decides it, so no seed is spent on it
    assert "no known range" in looks[0].claims[0].detail and looks[0].final
    spec = [("eval_accuracy[loops=4] > 0.6", None)]  # three successes: (0.95 / 0.6) ** 3 = 4, not 20
    look = sequential.take_look(_study(SUCCESSES[:3], "eval_accuracy"), design, [], specs=spec)
    claim = look.claims[0]
    assert claim.state == "sampling" and claim.p_claimed < claim.nominal and "held back" in claim.detail


def test_a_claim_whose_gate_cannot_pass_by_max_at_its_trend_is_futile():
    design = sequential.Design(4, 6, 1)  # judged from 4 seeds (MIN_FUTILITY_SEEDS)
    spec = [("eval_accuracy[loops=4] > 0.74", None)]
    look = sequential.take_look(_study([0.78, 0.79, 0.77, 0.78], "eval_accuracy"), design, [], specs=spec)
    claim = look.claims[0]  # (0.78 / 0.74) ** 6 is far below 20: no seed count up to max can pass the gate
    assert claim.state == "futile" and "distribution-free bound" in claim.detail and look.next_seeds == {"c": 4}


def test_seeds_needed_counts_the_seeds_the_gate_needs():
    from studyrunner.analysis.claims import power

    data = _study(SUCCESSES, "eval_accuracy")
    v = power.fill(data, [claims_mod.evaluate(data, "eval_accuracy[loops=4] > 0.74")])[0]
    mean = float(np.mean(SUCCESSES))
    gate = int(np.ceil(np.log(20) / np.log(mean / 0.74)))  # the all-in bet's seeds at the observed mean
    assert (
        v.seeds_needed["observed"]["per_side"] == gate > 5
        and "distribution-free" in v.seeds_needed["observed"]["method"]
    )
    data = _study(SUCCESSES, "score")  # no known range: no test, so no seed count decides it
    v = power.fill(data, [claims_mod.evaluate(data, "score[loops=4] > 0.95")])[0]
    assert v.seeds_needed is None
