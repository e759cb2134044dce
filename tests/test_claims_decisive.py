"""How claims are decided, which sequential looks rest on: the seed as the unit, exact tests on bimodal, split
and tied seeds, one α, every p under Holm. One test per fault an audit of the tests found (each fails on the code
before the fix), property tests that a verdict and its shown interval always agree, and `validate`'s report of the
smallest p each claim's test can reach. Synthetic frames, no training."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from typer.testing import CliRunner

from studyrunner.analysis import claims
from studyrunner.analysis.data import from_frame
from studyrunner.cli import app

runner = CliRunner()


def frame(values: dict[tuple[int, int], list[float]], failed: dict[tuple[int, int], list[bool]] | None = None):
    """A trials frame: {(loops, block_layers): per-seed values (NaN: no trial)}; `failed`: status failed."""
    rows = []
    for (loops, block), ys in values.items():
        for seed, y in enumerate(ys):
            if y is None:
                continue
            bad = bool(failed and failed.get((loops, block), [False] * len(ys))[seed])
            rows.append(
                {
                    "trial_key": f"L{loops}B{block}-s{seed}",
                    "cell_hash": f"L{loops}B{block}",
                    "cell": f"loops={loops} block_layers={block}",
                    "seed": seed,
                    "status": "failed" if bad else "succeeded",
                    "model.params.block_layers": block,
                    "model.params.loops": loops,
                    "model.params.width": 2 if loops * block > 1 else 1,
                    "effective_depth": float(loops * block),
                    "baseline": "",
                    "baseline_of": "",
                    "y": y,
                }
            )
    return pd.DataFrame(rows)


def data(values, failed=None, failure=None, claim_list=None):
    return from_frame(frame(values, failed), metric="y", failure=failure, claims=claim_list)


# --- fault 1: the seed is the unit of replication -------------------------------------------------------


def test_several_cells_at_one_depth_keep_the_seed_as_the_unit():
    """The quickstart's all-cell slope (1x1 at D=1; 1x4 and 4x1 at D=4) fell back to Welch over the cell
    values ("Welch t (4 vs 2 seeds)") and ignored that a seed's cells share its initialisation: seed
    effects large, the contrast small. CR2 by seed is the paired t over per-seed depth means."""
    values = {(1, 1): [0.30, 0.60], (4, 1): [0.36, 0.64], (1, 4): [0.37, 0.66]}
    d = data(values)
    slope = claims.evaluate(d, "slope(y ~ ln effective_depth) > 0")
    per_seed = np.array([(0.36 + 0.37) / 2 - 0.30, (0.64 + 0.66) / 2 - 0.60]) / math.log(4)
    expected = sps.ttest_1samp(per_seed, 0, alternative="greater").pvalue
    assert "CR2 t by seed (2 seeds)" in slope.test and "Welch" not in slope.test
    assert slope.p == pytest.approx(expected)
    # the same contrast as a claim over two cells a side: per-seed side means, paired over the seeds
    pair = claims.evaluate(d, "y[width=2] > y[width=1]")
    assert pair.test.startswith("paired t") and "per-seed means over cells" in pair.test
    assert pair.p == pytest.approx(expected) and pair.seeds == (2, 2)


def test_a_two_depth_slope_with_a_seed_missing_has_its_estimate_inside_its_interval():
    """With one seed missing at one depth, the estimate came from the fit (all seeds) and the interval
    from the paired t (shared seeds): the estimate could lie outside its own interval."""
    values = {(1, 1): [0.30, 0.40, 0.35, 0.10], (4, 1): [0.41, 0.48, 0.47, None]}
    v = claims.evaluate(data(values), "slope(y ~ ln effective_depth) > 0")
    assert v.lo <= v.estimate <= v.hi, v
    assert "CR2" in v.test


# --- fault 2: bimodal, failure-split and tied seeds ---------------------------------------------------------


def test_a_comparison_on_failure_split_seeds_uses_an_exact_randomisation_test():
    """Two seeds that learned beside two that fell to chance, split by the failure rule: the paired t
    called this 'supported' (p 0.004); the sign flips of 2 seeds cannot reach p < 0.25."""
    values = {(1, 1): [0.25, 0.26], (4, 1): [0.90, 0.93]}
    d = data(values, failure="y < 0.4")
    v = claims.evaluate(d, "y[loops=4] > y[loops=1]")
    assert v.verdict == "inconclusive" and "sign-flip" in v.test and v.p == pytest.approx(0.25)
    assert "failure rule splits" in v.detail and "cannot reach p < 0.05" in v.detail
    assert v.lo <= 0 <= v.hi  # the interval is the test's own
    # with 5 seeds the exact test can decide
    values = {(1, 1): [0.25, 0.26, 0.96, 0.24, 0.27], (4, 1): [0.90, 0.93, 0.95, 0.91, 0.92]}
    v = claims.evaluate(data(values, failure="y < 0.4"), "y[loops=4] > y[loops=1]")
    assert v.verdict == "inconclusive" and v.p == pytest.approx(2 / 32)  # one seed: loops=1 learned, a bit better
    values[(1, 1)][2] = 0.26
    v = claims.evaluate(data(values, failure="y < 0.4"), "y[loops=4] > y[loops=1]")
    assert v.verdict == "supported" and v.p == pytest.approx(1 / 32) and v.lo > 0


def test_a_mean_or_iqm_against_a_number_on_bimodal_seeds_cannot_be_decided():
    """`iqm(y) > c` with c the true IQM was called supported 22-33% of the time on bimodal seeds: no test
    of a location against a number holds there. It says so and points to the failure rate."""
    values = {(1, 1): [0.25, 0.91, 0.92, 0.90, 0.93]}  # bimodal is read from 5 seeds (claims.evidence.BIMODAL_FROM)
    for claim in ("iqm(y)[loops=1] > 0.6", "y[loops=1] > 0.5"):
        v = claims.evaluate(data(values), claim)  # bimodal by its values (no rule)
        assert v.verdict == "inconclusive" and math.isnan(v.p) and math.isnan(v.lo), v
        assert "bimodal" in v.detail and "failure_rate[loops=1] < 0.5" in v.detail
        # a study with a failure rule says seeds may fail: even seeds that all learned do not decide it
        v = claims.evaluate(data({(1, 1): [0.91, 0.92, 0.90]}, failure="y < 0.4"), claim)
        assert v.verdict == "inconclusive" and "failure rule" in v.detail
    # a median against a number: the sign test holds on any seeds
    v = claims.evaluate(data({(1, 1): [0.25, 0.91, 0.92, 0.90, 0.93]}), "median(y)[loops=1] > 0.5")
    assert v.verdict == "inconclusive" and v.p == pytest.approx(6 / 32)


def test_accuracies_tied_at_the_ceiling_do_not_decide_by_a_degenerate_t_test():
    """Seeds at 1.0 have no spread: the t-test gave p = 0 ('supported') for any mean below 1."""
    v = claims.evaluate(data({(1, 1): [1.0, 1.0, 1.0]}), "y[loops=1] > 0.99")
    assert v.verdict == "inconclusive" and "tie at 1" in v.detail
    v = claims.evaluate(data({(1, 1): [0.99, 0.98], (4, 1): [1.0, 1.0]}), "y[loops=4] > y[loops=1]")
    assert v.verdict == "inconclusive" and "sign-flip" in v.test
    # identical differences without ties: the t-test has nothing to estimate; the exact test decides
    v = claims.evaluate(data({(1, 1): [0.5, 0.6, 0.7], (4, 1): [0.6, 0.7, 0.8]}), "y[loops=4] > y[loops=1]")
    assert v.verdict == "inconclusive" and "sign-flip" in v.test and v.p == pytest.approx(1 / 8)


def test_a_metric_that_does_not_depend_on_the_seed_is_decided_exactly():
    """A cache size is the same for every seed: the difference is a fact, not an estimate (melt_memory's
    KV claims). Seeds tied at 0 or 1 are a share at a bound instead, and are not taken for a fact."""
    d = data({(1, 1): [512.0, 512.0], (4, 1): [4096.0, 4096.0], (2, 1): [1024.0, 1024.0]})
    for claim in ("y[loops=4] > y[loops=1]", "y[loops=4] > 1000", "slope(y ~ loops) > 0"):
        v = claims.evaluate(d, claim)
        assert v.verdict == "supported" and v.p == 0 and v.lo == v.hi == v.estimate, (claim, v)
        assert "does not depend on the seed" in v.test
    assert claims.evaluate(d, "y[loops=4] < y[loops=1]").verdict == "contradicted"
    v = claims.evaluate(data({(1, 1): [1.0, 1.0], (4, 1): [0.5, 0.5]}), "y[loops=1] > y[loops=4]")
    assert v.verdict == "inconclusive" and "sign-flip" in v.test


def test_a_slope_on_bimodal_seeds_is_decided_by_permuting_each_seeds_values():
    values = {(1, 1): [0.25, 0.9, 0.26], (2, 1): [0.9, 0.26, 0.91], (4, 1): [0.92, 0.95, 0.25]}
    v = claims.evaluate(data(values, failure="y < 0.4"), "slope(y ~ ln effective_depth) > 0")
    assert "permutation test of the slope within each of 3 seeds" in v.test
    assert v.verdict == "inconclusive" and v.lo <= v.estimate <= v.hi


# --- fault 3: one alpha, every decided claim with its p, identical hypotheses once -------------------------------


def test_one_alpha_exactly():
    """ALPHA was 1 − 0.95 = 0.050000000000000044, so p = 0.05 counted: Fisher 3/3 vs 0/3 failed."""
    assert claims.ALPHA == 0.05
    d = data({(1, 1): [1, 1, 1], (4, 1): [0, 0, 0]}, failed={(1, 1): [True] * 3}, claim_list=[])
    # disjoint cells, so Fisher: p = 1/20 = 0.05 exactly, not below it
    d.trials.loc[d.trials.cell_hash == "L4B1", "seed"] += 10
    v = claims.evaluate(d, "failure_rate[loops=1] > failure_rate[loops=4]")
    assert "Fisher" in v.test and v.p == pytest.approx(0.05) and v.verdict == "inconclusive"


def test_t_claims_are_decided_at_one_sided_alpha_like_the_exact_tests():
    """t-based claims were decided by a 95% two-sided interval (one-sided 0.025 a side)."""
    d = data({(1, 1): [0.50, 0.52, 0.47, 0.55], (4, 1): [0.53, 0.57, 0.468, 0.60]})
    v = claims.evaluate(d, "y[loops=4] > y[loops=1]")
    a, b = np.array([0.53, 0.57, 0.468, 0.60]), np.array([0.50, 0.52, 0.47, 0.55])
    one_sided = sps.ttest_rel(a, b, alternative="greater").pvalue
    assert 0.025 < one_sided < 0.05
    assert v.verdict == "supported" and v.p == pytest.approx(one_sided) and v.lo > 0
    assert v.p_claimed == v.p and v.p_opposite == pytest.approx(1 - one_sided)
    # the interval is the two one-sided 95% bounds: a 90% t-interval
    d_ = a - b
    half = sps.t.ppf(0.95, 3) * d_.std(ddof=1) / 2
    assert (v.lo, v.hi) == pytest.approx((d_.mean() - half, d_.mean() + half))
    # another alpha (a sequential look's nominal level): the verdict and interval follow it
    v = claims.evaluate(d, "y[loops=4] > y[loops=1]", alpha=0.01)
    assert v.verdict == "inconclusive" and v.lo < 0 and v.alpha == 0.01


def test_every_decided_claim_carries_its_p_so_holm_covers_it():
    """Yuen, median and bootstrap verdicts carried p = NaN and escaped --holm."""
    rng = np.random.default_rng(1)
    values = {(1, 1): list(0.5 + rng.normal(0, 0.02, 10)), (4, 1): list(0.6 + rng.normal(0, 0.02, 10))}
    d = data(values)
    for claim in (
        "iqm(y)[loops=4] > iqm(y)[loops=1]",
        "median(y)[loops=4] > 0.5",
        "median(y)[loops=4] > median(y)[loops=1]",
    ):
        v = claims.evaluate(d, claim)
        assert v.verdict == "supported" and 0 <= v.p < 0.05 and v.lo > 0, (claim, v)
    # an IQM of a metric of no known range against a number is decided by no test (claims.location.no_range)
    v = claims.evaluate(d, "iqm(y)[loops=4] > 0.5")
    assert v.verdict == "inconclusive" and "no known range" in v.detail
    verdicts = claims.verify(d, ["median(y)[loops=4] > median(y)[loops=1]", "median(y)[loops=4] > 0.5"], holm=True)
    assert all(np.isfinite(v.p_holm) for v in verdicts)


def test_holm_counts_a_two_depth_slope_and_its_pairwise_claim_once():
    d = data({(1, 1): [0.50, 0.52, 0.47, 0.55], (4, 1): [0.53, 0.56, 0.48, 0.60]})
    slope, pair, other = claims.verify(
        d, ["slope(y ~ ln effective_depth) > 0", "y[loops=4] > y[loops=1]", "failure_rate < 0.6"], holm=True
    )
    assert slope.p == pytest.approx(pair.p)
    # two hypotheses, not three: the smaller p is multiplied by 2
    assert slope.p_holm == pair.p_holm == pytest.approx(min(1, max(2 * min(slope.p, other.p), slope.p)))
    assert other.p < slope.p and other.p_holm == pytest.approx(2 * other.p)
    assert slope.verdict_holm == "supported"


# --- fault 4: the interval shown is the test's ---------------------------------------------------------------


def test_the_exact_tests_show_their_own_intervals():
    """2/2 vs 0/2 failed showed Newcombe [0.07, 1.00] beside an inconclusive Fisher p = 0.167; McNemar
    claims showed the unpaired Newcombe interval."""
    d = data({(1, 1): [1, 1], (4, 1): [0, 0]}, failed={(1, 1): [True, True]})
    d.trials.loc[d.trials.cell_hash == "L4B1", "seed"] += 10
    v = claims.evaluate(d, "failure_rate[loops=1] > failure_rate[loops=4]")
    assert v.p == pytest.approx(1 / 6) and v.verdict == "inconclusive"
    assert v.scale == "odds ratio" and v.lo <= 1 <= v.hi
    d = data({(1, 1): [1, 1, 1], (4, 1): [0, 0, 0]}, failed={(1, 1): [True, True, True]})
    v = claims.evaluate(d, "failure_rate[loops=1] > failure_rate[loops=4]")
    assert "McNemar" in v.test and v.p == pytest.approx(1 / 8) and v.lo < 0 < v.hi
    lo = sps.beta.ppf(0.05, 3, 1)  # Clopper-Pearson of 3/3 discordant seeds, mapped onto the difference
    assert v.lo == pytest.approx(2 * lo - 1)


def _table_verdicts():
    """Every failure-rate table up to 5 seeds a side, each claim direction: (verdict, lo, hi, null)."""
    out = []
    for n in range(1, 6):
        for k1, k2 in itertools.product(range(n + 1), repeat=2):
            for op in ("<", ">"):
                fail1 = [True] * k1 + [False] * (n - k1)
                fail2 = [True] * k2 + [False] * (n - k2)
                d = data({(1, 1): [0.5] * n, (4, 1): [0.5] * n}, failed={(1, 1): fail1, (4, 1): fail2})
                out.append(claims.evaluate(d, f"failure_rate[loops=1] {op} failure_rate[loops=4]"))  # McNemar
                d.trials.loc[d.trials.cell_hash == "L4B1", "seed"] += 10
                out.append(claims.evaluate(d, f"failure_rate[loops=1] {op} failure_rate[loops=4]"))  # Fisher
                for c in (0.1, 0.3, 0.5, 0.8):
                    out.append(claims.evaluate(d, f"failure_rate[loops=1] {op} {c}"))  # binomial
    return out


def test_verdict_and_interval_agree_on_every_small_table():
    verdicts = _table_verdicts()
    assert len(verdicts) > 1000
    for v in verdicts:
        greater = ">" in v.claim
        null = 1.0 if getattr(v, "scale", "") == "odds ratio" else 0.0
        above, below = v.lo > null, v.hi < null
        if v.verdict == "supported":
            assert above if greater else below, v
        elif v.verdict == "contradicted":
            assert below if greater else above, v
        else:
            assert not above and not below, v


@pytest.mark.parametrize("seed", range(3))
def test_randomisation_tests_match_enumeration_and_their_intervals(seed):
    """The exact tests' p-values against brute-force enumeration, and their bounds against the verdict."""
    from studyrunner.analysis.claims import exact

    rng = np.random.default_rng(seed)
    for _ in range(30):
        n = int(rng.integers(1, 7))
        d = rng.normal(0.2, 1, n)
        null = float(rng.normal(0, 0.3))
        res = exact.sign_flip(d, 0.05, null)
        flips = [np.mean(np.array(s) * (d - null)) for s in itertools.product((1, -1), repeat=n)]
        assert res.p_up == pytest.approx(np.mean(np.array(flips) >= np.mean(d - null) - 1e-12))
        assert (res.lo > null) == (res.p_up < 0.05) and (res.hi < null) == (res.p_down < 0.05)
        assert res.lo <= res.estimate <= res.hi
        a, b = rng.normal(0.3, 1, int(rng.integers(1, 5))), rng.normal(0, 1, int(rng.integers(1, 5)))
        res = exact.two_sample(a, b, 0.05, null)
        assert (res.lo > null) == (res.p_up < 0.05) and (res.hi < null) == (res.p_down < 0.05)


# --- fault 5: paired IQMs ---------------------------------------------------------------------------------


def test_iqm_claims_over_shared_seeds_are_paired():
    """IQM vs IQM ignored the pairing (two-sample Yuen): large seed effects, a small consistent gain."""
    seed_effect = np.array([0.0, 0.2, -0.15, 0.1, 0.3, -0.2, 0.05, -0.05])
    gain = np.array([0.02, 0.025, 0.018, 0.022, 0.021, 0.019, 0.023, 0.02])
    d = data({(1, 1): list(0.5 + seed_effect), (4, 1): list(0.5 + seed_effect + gain)})
    v = claims.evaluate(d, "iqm(y)[loops=4] > iqm(y)[loops=1]")
    assert v.test.startswith("paired Yuen") and v.verdict == "supported"
    g = np.sort(gain)[2:6]
    assert v.estimate == pytest.approx(g.mean())  # the IQM of the per-seed differences
    two_sample = sps.ttest_ind(0.5 + seed_effect + gain, 0.5 + seed_effect, equal_var=False, trim=0.25)
    assert two_sample.pvalue > 0.5  # what the unpaired test said


# --- validate and plan: what each claim's test can reach -------------------------------------------------------


def test_validate_prints_the_smallest_p_each_claim_can_reach(tmp_path):
    from analysis_ledger import study_text

    claims_text = (
        "claims:\n"
        '  - "failure_rate[loops=1, block_layers=1] > failure_rate[loops=8, block_layers=1]"\n'
        '  - "failure_rate[loops=8] < 0.3"\n'
        '  - "failure_rate[loops=8, block_layers=1] < 0.3"\n'
        '  - "eval_accuracy[loops=8] > eval_accuracy[loops=1]"\n'
        '  - "eval_accuracy[loops=8] > 0.6"\n'
        '  - "eval_loss[loops=8] < 0.6"\n'
    )
    path = tmp_path / "s.yaml"
    path.write_text(study_text(extra=claims_text))  # 4 seeds a cell
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "claims[0]" in out and "McNemar test, smallest p 0.0625: cannot reach p < 0.05 with 4 seeds (needs 5)" in out
    assert "claims[1]" in out and "exact binomial test, smallest p 0.0576" in out  # 8 trials: 0.7^8
    assert "claims[2]" in out and "(needs 9)" in out  # 0.7^4: a binomial < 0.3 needs 9 seeds
    assert "claims[3]" in out and "paired t, any p" in out
    # an accuracy against a number: the distribution-free gate's smallest p is 0.6^4 (every seed at 1); a loss has
    # no known range, so no test of its mean against a number holds (it was the t-test alone)
    assert (
        "claims[4]" in out
        and "distribution-free bound, smallest p 0.13: cannot reach p < 0.05 with 4 seeds (needs 6)" in out
    )
    assert "claims[5]" in out and "eval_loss has no known range" in out
    assert "claims[5] cannot be decided with 4 seeds" in result.stderr
    assert "claims[0] cannot be decided with 4 seeds; it needs 5" in result.stderr
    # an accuracy compared between cells: seeds tied at its bound fall back to the exact test, which needs 5
    flat = " ".join(result.stderr.split())
    assert "claims[3]: seeds that tie at the metric's bound" in flat and "give it 5 seeds or more" in flat
    assert flat.count("seeds that tie at the metric's bound") == 1  # not the failure-rate or number claims
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 0 and "exact McNemar test, smallest p 0.0625" in result.stdout


# --- the mapping form of a claim ------------------------------------------------------------------------------


def test_claims_may_be_mappings_with_a_min_effect(tmp_path):
    import json

    import yaml
    from analysis_ledger import study_text

    from studyrunner.study import loads

    extra = (
        'claims:\n  - "eval_accuracy[loops=8] > 0.1"\n'
        '  - {claim: "eval_accuracy[loops=8] > eval_accuracy[loops=1]", min_effect: 0.05}\n'
    )
    study = loads(study_text(extra=extra))
    assert study.claim_texts == ["eval_accuracy[loops=8] > 0.1", "eval_accuracy[loops=8] > eval_accuracy[loops=1]"]
    assert [c.min_effect for c in study.claims] == [None, 0.05]
    # written back as written: a string stays a string
    assert yaml.safe_load(yaml.safe_dump(study.model_dump(mode="json")))["claims"] == [
        "eval_accuracy[loops=8] > 0.1",
        {"claim": "eval_accuracy[loops=8] > eval_accuracy[loops=1]", "min_effect": 0.05},
    ]
    schema = json.loads(runner.invoke(app, ["schema"]).stdout)
    entry = schema["$defs"]["ClaimEntry"]["anyOf"]
    assert entry[0]["type"] == "string" and set(entry[1]["properties"]) == {"claim", "min_effect", "margin", "matched"}
    for bad, fragment in (
        (
            '{claim: "eval_accuracy[loops=8] > 0.1", min_effect: -0.1}',
            "claims[0].min_effect: Input should be greater than 0",
        ),
        (
            '{claim: "eval_accuracy[loops=8] > 0.1", effect: 0.1}',
            "claims[0].effect: unknown key; valid keys: claim, margin, matched, min_effect",
        ),
        ("{min_effect: 0.1}", "claims[0].claim: required field is missing"),
        ('{claim: "eval_accuracy[loops=8 > 0.1"}', "claims[0]: position 23"),
        ("[1, 2]", "claims[0]: a claim is a string such as"),
    ):
        path = tmp_path / "bad.yaml"
        path.write_text(study_text(extra=f"claims:\n  - {bad}\n"))
        result = runner.invoke(app, ["validate", str(path)])
        assert result.exit_code == 2 and fragment in result.stderr, (bad, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
