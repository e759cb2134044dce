"""Claims while a study runs (pending), failure rates by exact one-sided tests, p-values and Holm's
adjustment, slope rows, and the few-seeds note: on synthetic ledgers (no training)."""

import json
import math

import numpy as np
import pytest
from analysis_ledger import build, loglinear_outcome
from scipy import stats as sps
from typer.testing import CliRunner

from studyrunner.analysis import claims as claims_mod
from studyrunner.analysis import data as data_mod
from studyrunner.analysis.claims.slope import slope_fit
from studyrunner.cli import app
from studyrunner.study.claims_grammar import parse_claim

runner = CliRunner()

# loops=8 x block_layers=2 seeds 1, 2, 3 stay pending (build's last three trials)
PENDING_SIDE = "eval_accuracy[loops=8, block_layers=2] > eval_accuracy[loops=1, block_layers=2]"
PENDING_WRONG = "eval_accuracy[loops=8, block_layers=2] < eval_accuracy[loops=1, block_layers=2]"
FINISHED = "eval_accuracy[loops=8, block_layers=1] > eval_accuracy[loops=1, block_layers=1]"


def failing(params, seed):  # loops=1 x 1 block fails (3 by the rule, seed 3 crashes); loops=8 never does
    base = loglinear_outcome()(params, seed)
    if params["loops"] == 1 and params["block_layers"] == 1:
        return None if seed == 3 else {**base, "eval_accuracy": 0.1}
    return base


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory):
    root = tmp_path_factory.mktemp("verdicts")
    build(root / "running", loglinear_outcome(), leave_pending=3)
    build(root / "failing", failing, extra='failure: "eval_accuracy < 0.2"\n')
    build(root / "clean", loglinear_outcome())
    return root


def load(root, name):
    return data_mod.load("synth", workspace=root / name)


# --- pending ---------------------------------------------------------------------------------------


def test_claims_on_unfinished_trials_are_pending_not_invalid(ledgers):
    data = load(ledgers, "running")
    v = claims_mod.evaluate(data, PENDING_WRONG)
    assert v.verdict == "pending" and v.unfinished == 3
    # one finished seed of loops=8 x 2 blocks so far: the interim verdict is shown, not final
    assert v.detail.startswith("pending: 3 trials unfinished; inconclusive on the finished seeds so far"), v.detail
    assert claims_mod.evaluate(data, FINISHED).verdict == "supported"
    # a side with no finished trial yet: pending, not "no finished trial matches" (invalid)
    data.trials.loc[data.trials.cell == "loops=8 block_layers=2", "status"] = "running"
    v = claims_mod.evaluate(data, "eval_accuracy[loops=8, block_layers=2] > 0.1")
    assert v.verdict == "pending" and v.detail.startswith("pending: 4 trials unfinished"), v
    # a field the study does not have is invalid however many trials are unfinished
    assert claims_mod.evaluate(data, "eval_accuracy[memory_slots=2] > 0.1").verdict == "invalid"


def test_verify_during_a_running_study_exits_0_unless_a_finished_claim_is_contradicted(ledgers, tmp_path):
    root = ledgers / "running"
    study = tmp_path / "synth.yaml"
    text = (root / "synth.yaml").read_text()
    study.write_text(text + f'claims:\n  - "{PENDING_WRONG}"\n  - "{FINISHED}"\n')
    result = runner.invoke(app, ["verify", str(study), "--workspace", str(root)])
    assert result.exit_code == 0, result.output
    assert "pending" in result.output and "supported" in result.output
    wrong = FINISHED.replace(">", "<")
    study.write_text(text + f'claims:\n  - "{PENDING_WRONG}"\n  - "{wrong}"\n')
    result = runner.invoke(app, ["verify", str(study), "--workspace", str(root)])
    assert result.exit_code == 1 and "contradicted" in result.output


# --- failure rates -------------------------------------------------------------------------------


def test_failure_rate_pairs_shared_seeds_with_an_exact_mcnemar_test(ledgers):
    data = load(ledgers, "failing")
    # one cell a side, seeds 0-3 on both: 4 discordant seeds, all one way; exact one-sided p = 1/16
    v = claims_mod.evaluate(data, "failure_rate[loops=1, block_layers=1] > failure_rate[loops=8, block_layers=1]")
    assert v.verdict == "inconclusive" and "McNemar" in v.test
    assert v.p == pytest.approx(0.0625) and "one-sided p=0.0625" in v.detail
    assert v.lo < 0 < v.hi  # the exact conditional interval agrees (Newcombe's interval, lo > 0, did not)
    # unpaired (two cells on the right): Fisher's exact one-sided, 4/4 vs 0/8
    v = claims_mod.evaluate(data, "failure_rate[loops=1, block_layers=1] > failure_rate[loops=8]")
    expected = sps.fisher_exact([[4, 0], [0, 8]], alternative="greater").pvalue
    assert v.verdict == "supported" and "Fisher" in v.test and v.p == pytest.approx(expected)
    v = claims_mod.evaluate(data, "failure_rate[loops=1, block_layers=1] < failure_rate[loops=8]")
    assert v.verdict == "contradicted" and v.p == pytest.approx(expected)  # the p in the verdict's direction


def test_failure_rate_against_a_number_uses_an_exact_binomial_test(ledgers):
    data = load(ledgers, "failing")
    v = claims_mod.evaluate(data, "failure_rate[loops=8] < 0.6")  # 0/8 failed
    assert v.verdict == "supported" and v.p == pytest.approx(0.4**8) and "binomial" in v.test
    v = claims_mod.evaluate(data, "failure_rate[loops=8] < 0.3")  # 0.7^8 = 0.058: not shown
    assert v.verdict == "inconclusive" and v.p == pytest.approx(0.7**8)
    v = claims_mod.evaluate(data, "failure_rate[loops=1, block_layers=1] < 0.3")  # 4/4 failed
    assert v.verdict == "contradicted" and v.p == pytest.approx(0.3**4)
    assert claims_mod.evaluate(data, "failure_rate[loops=8] < 1.5").verdict == "invalid"


# --- p-values and Holm ----------------------------------------------------------------------------


def test_t_claims_carry_the_one_sided_p_of_their_interval(ledgers):
    data = load(ledgers, "clean")
    v = claims_mod.evaluate(data, FINISHED)
    a = data.select((("loops", 8), ("block_layers", 1))).sort_values("seed").eval_accuracy.to_numpy()
    b = data.select((("loops", 1), ("block_layers", 1))).sort_values("seed").eval_accuracy.to_numpy()
    assert v.p == pytest.approx(sps.ttest_rel(a, b, alternative="greater").pvalue, abs=1e-12)  # offsets: p ~ 0
    noisy = a + np.array([0.01, -0.02, 0.03, 0.0])
    data.trials.loc[data.select((("loops", 8), ("block_layers", 1))).sort_values("seed").index, "eval_accuracy"] = noisy
    v = claims_mod.evaluate(data, FINISHED)
    assert 0 < v.p < 0.05 and v.p == pytest.approx(sps.ttest_rel(noisy, b, alternative="greater").pvalue)
    assert v.p_claimed == v.p and v.p_opposite == pytest.approx(1 - v.p)
    v = claims_mod.evaluate(data, "eval_accuracy[loops=8, block_layers=1] > eval_accuracy[loops=1, block_layers=2]")
    assert v.test.startswith("paired") and 0 < v.p < 0.05
    v = claims_mod.evaluate(data, "eval_accuracy[loops=1, block_layers=1] > 0.29")
    values = data.select((("loops", 1), ("block_layers", 1))).eval_accuracy
    t_p = sps.ttest_1samp(values, 0.29, alternative="greater").pvalue
    # an accuracy against a number: the t-test and the distribution-free gate (analysis/claims/bounded.py) both decide,
    # so the claim carries the larger p; here (seeds just above 0.29) the t-test alone would have supported it
    assert v.extra["gate"]["t_claimed"] == pytest.approx(t_p) and t_p < 0.05
    assert v.p == pytest.approx(max(t_p, v.extra["gate"]["claimed"])) and v.verdict == "inconclusive"
    assert "held back by the distribution-free bound" in v.detail
    v = claims_mod.evaluate(data, "iqm(eval_accuracy)[loops=4, block_layers=1] > 0.4")  # Yuen: a p, so Holm sees it
    assert 0 < v.p < 0.05 and v.verdict == "supported"


def test_holm_adjusts_decided_claims_and_leaves_the_rest():
    V = claims_mod.Verdict
    verdicts = [
        V("a", "supported", p=0.03),
        V("b", "contradicted", p=0.04),
        V("c", "supported"),  # no p: not adjusted
        V("d", "invalid", p=0.001),
        V("e", "inconclusive", p=0.5),
    ]
    claims_mod.adjust_holm(verdicts)
    expected = [min(1, p) for p in (0.03 * 3, 0.04 * 2, 0.5)]
    expected = list(np.maximum.accumulate(expected))
    assert [v.p_holm for v in (verdicts[0], verdicts[1], verdicts[4])] == pytest.approx(expected)
    assert [v.verdict_holm for v in verdicts] == [
        "inconclusive",
        "inconclusive",
        "supported",
        "invalid",
        "inconclusive",
    ]
    assert [v.verdict for v in verdicts][:2] == ["supported", "contradicted"]  # the raw verdicts stay
    assert math.isnan(verdicts[2].p_holm) and math.isnan(verdicts[3].p_holm)


def test_verify_holm_shows_adjusted_columns_and_exits_by_them(ledgers, tmp_path):
    root = ledgers / "clean"
    study = tmp_path / "synth.yaml"
    claims = [FINISHED, "eval_accuracy[loops=8] > eval_accuracy[loops=1]", "eval_accuracy[loops=1] > 0.05"]
    study.write_text((root / "synth.yaml").read_text() + "claims:\n" + "".join(f'  - "{c}"\n' for c in claims))
    result = runner.invoke(app, ["verify", str(study), "--workspace", str(root), "--holm", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {"p", "p_holm", "verdict_holm"} <= set(rows[0])
    assert all(r["p_holm"] >= r["p"] for r in rows)
    assert [r["verdict_holm"] for r in rows] == ["supported"] * 3
    result = runner.invoke(app, ["verify", str(study), "--workspace", str(root), "--holm"])
    assert result.exit_code == 0 and "p (Holm)" in result.output and "verdict (Holm)" in result.output
    result = runner.invoke(app, ["verify", str(study), "--workspace", str(root), "--format", "json"])
    assert "p_holm" not in json.loads(result.stdout)[0] and "p" in json.loads(result.stdout)[0]


# --- slope rows and few seeds -----------------------------------------------------------------------


def test_slope_keeps_failed_seeds_with_a_value_and_drops_those_without(ledgers):
    data = load(ledgers, "failing")
    text = "slope(eval_accuracy ~ ln loops)[block_layers=1] > 0"
    q = parse_claim(text).lhs
    fit = slope_fit(data, q, data.select(q.selector))
    assert fit.n == 15  # 16 seeds: the 3 failed by the rule kept at their value, the crashed one dropped
    v = claims_mod.evaluate(data, text)
    assert "1 seeds dropped: no value (diverged)" in v.detail


def test_claims_on_fewer_than_3_seeds_a_side_say_so(ledgers):
    data = load(ledgers, "clean")
    # two cells a side, one seed: the seed is the unit of replication, so one value a side, and no test
    v = claims_mod.evaluate(data, "eval_accuracy[loops=8, seed=0] > eval_accuracy[loops=1, seed=0]")
    assert v.seeds == (1, 1) and "1 seed per side: an interval from fewer than 3 seeds is wide" in v.detail
    assert v.verdict == "inconclusive" and math.isnan(v.p)
    v = claims_mod.evaluate(data, FINISHED)
    assert v.seeds == (4, 4) and "seeds per side" not in v.detail
    v = claims_mod.evaluate(data, "failure_rate[loops=8, seed=1] < 0.5")
    assert v.seeds == (2,) and "2 seeds per side" in v.detail
