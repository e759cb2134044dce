"""Sequential seeds, without Ray: the study file's `seeds: {start, max}`, the group-sequential arithmetic
(spending functions, boundaries, repeated p-values) against published values and scipy's multivariate normal, and
the looks `take_look` takes on synthetic studies."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from conftest import TINY_STUDY
from scipy.stats import multivariate_normal, norm

from studyrunner.analysis import sequential
from studyrunner.analysis.data import StudyData, annotate
from studyrunner.errors import SpecError
from studyrunner.study import compile_study, loads

SEQUENTIAL = "seeds: {start: 2, max: 5, step: 1}"
CLAIMS = 'claims: ["eval_accuracy[loops=2] > 0.2"]\n'


def sequential_text(seeds: str = SEQUENTIAL, claims: str = CLAIMS) -> str:
    return TINY_STUDY.replace("seeds: [0, 1]", seeds) + claims


# ---------------------------------------------------------------------------------------------- the file


@pytest.mark.parametrize(
    ("seeds", "says"),
    [
        ("seeds: {start: 1, max: 12}", r"seeds.start: Input should be greater than or equal to 2"),
        ("seeds: {start: 3, max: 2}", r"seeds: max \(2\) must be at least start \(3\)"),
        ("seeds: {start: 3, max: 8, step: 0}", r"seeds.step: Input should be greater than or equal to 1"),
        ("seeds: {start: 3, max: 8, stop: 2}", r"seeds.stop: unknown key; valid keys: max, spending, start, step"),
        (
            "seeds: {start: 3, max: 8, spending: linear}",
            r"seeds.spending: Input should be 'obrien_fleming' or 'pocock'",
        ),
        ("seeds: {start: 3}", r"seeds.max: required field is missing"),
        ("seeds: 3", r"seeds: give a list of seeds, e.g. \[0, 1, 2\], or sequential seeds, e.g. \{start: 3, max: 12\}"),
        ("seeds: []", r"seeds: give at least one seed"),
    ],
)
def test_a_bad_seeds_field_is_one_line_naming_it(seeds, says):
    with pytest.raises(SpecError, match=says) as caught:
        loads(sequential_text(seeds))
    assert "\n" not in str(caught.value) and ":9: seeds" in str(caught.value)  # the file's line


def test_sequential_seeds_compile_to_the_first_wave_with_a_list_studys_trial_keys():
    compiled = compile_study(loads(sequential_text("seeds: {start: 3, max: 8}")))
    listed = compile_study(loads(TINY_STUDY.replace("seeds: [0, 1]", "seeds: [0, 1, 2, 3, 4, 5, 6, 7]")))
    assert compiled.study.first_seeds == [0, 1, 2] and compiled.study.seed_values == list(range(8))
    assert [t.trial_key for t in compiled.trials] == [t.trial_key for t in listed.trials if t.seed < 3]
    design = sequential.Design.of(compiled.study.sequential)
    assert (design.start, design.max, design.step, design.spending) == (3, 8, None, "obrien_fleming")
    # the default seed list is as before, and a list study compiles as it always did
    assert loads(TINY_STUDY.replace("seeds: [0, 1]\n", "")).seeds == [0]
    assert compile_study(loads(TINY_STUDY)).study.sequential is None


def test_a_sequential_study_without_claims_warns_it_runs_start_seeds_and_a_search_refuses_it():
    compiled = compile_study(loads(sequential_text(claims="")))
    assert any(
        "seeds: sequential seeds without claims: every cell runs its first 2 seeds" in w for w in compiled.warnings
    )
    assert len(compiled.trials) == 4
    search = (
        sequential_text()
        + "search: {algorithm: optuna, n_trials: 2, space: {train.lr: {loguniform: [1.0e-4, 1.0e-2]}}}\n"
    )
    with pytest.raises(SpecError, match=r"seeds: a search runs each configuration on a fixed list of seeds"):
        loads(search.replace("grid:\n  model.params.loops: [1, 2]\n", ""))


# ------------------------------------------------------------------------------------------ the arithmetic


def test_boundaries_are_the_published_lan_demets_ones():
    """Five equally spaced looks, one-sided 0.025 (Jennison & Turnbull 2000, table 7.6; gsDesign sfLDOF/sfLDPocock)."""
    t = tuple(np.arange(1, 6) / 5)
    assert np.allclose(
        sequential.boundaries(t, 0.025, "obrien_fleming"), [4.877, 3.357, 2.680, 2.290, 2.031], atol=2e-3
    )
    assert np.allclose(sequential.boundaries(t, 0.025, "pocock"), [2.438, 2.427, 2.410, 2.397, 2.386], atol=2e-3)


@pytest.mark.parametrize("kind", sequential.SPENDING)
def test_each_look_spends_what_the_spending_function_allows_under_the_joint_normal_law(kind):
    """P(cross by look k) under H0, from scipy's multivariate normal with corr √(t_i/t_j), is α(t_k) at every look,
    for unequal fractions as a sequential study's looks have them."""
    fractions = (2 / 12, 3 / 12, 5 / 12, 8 / 12, 1.0)
    bounds = sequential.boundaries(fractions, 0.05, kind)
    cov = np.array([[math.sqrt(min(a, b) / max(a, b)) for b in fractions] for a in fractions])
    for k in range(1, len(fractions) + 1):
        mvn = multivariate_normal(np.zeros(k), cov[:k, :k], abseps=1e-8, releps=1e-8, maxpts=10**6)
        crossed = 1 - mvn.cdf(np.array(bounds[:k]), rng=np.random.default_rng(0))
        assert crossed == pytest.approx(sequential.spent(kind, fractions[k - 1], 0.05), abs=2e-6)
    assert sequential.spent(kind, 1.0, 0.05) == pytest.approx(0.05)


def test_the_repeated_p_value_is_below_alpha_exactly_when_the_look_crosses():
    fractions = (0.25, 0.5, 0.75)
    c = sequential.boundaries(fractions, 0.05, "obrien_fleming")[-1]
    assert sequential.repeated_p(fractions, c + 1e-3) < 0.05 < sequential.repeated_p(fractions, c - 1e-3)
    assert sequential.repeated_p(fractions, c) == pytest.approx(0.05, rel=1e-3)
    assert sequential.repeated_p((1.0,), norm.isf(0.01)) == pytest.approx(0.01, rel=1e-3)  # one look: the usual p
    with pytest.raises(ValueError, match="increase"):
        sequential.boundaries((0.5, 0.5))


# ----------------------------------------------------------------------------------------------- looks


def frame(values: dict[str, list[float]]) -> pd.DataFrame:
    """A trials frame of cells loops=1 and loops=2 with the given eval_accuracy per seed, and the same values as
    `score`, a metric of no known range (its claims against a number are the t-test's alone, without the
    distribution-free gate an accuracy gets: analysis/claims/bounded.py)."""
    rows = []
    for cell, ys in values.items():
        loops = int(cell[-1])
        for seed, y in enumerate(ys):
            rows.append(
                {
                    "trial_key": f"{cell}-s{seed}",
                    "cell_hash": cell,
                    "cell": f"loops={loops}",
                    "seed": seed,
                    "status": "succeeded",
                    "model.params.loops": loops,
                    "effective_depth": float(loops),
                    "baseline_of": "",
                    "eval_accuracy": y,
                    "score": y,
                }
            )
    return annotate(pd.DataFrame(rows), None)


def study(values: dict[str, list[float]], claims: list[str]) -> StudyData:
    return StudyData("s", frame(values), claims=claims, cells_order=list(values))


ONE = [0.336, 0.422, 0.266, 0.352, 0.477]  # eval_accuracy of seeds 0-4 of a tiny looped cell
TWO = [0.320, 0.344, 0.242, 0.430, 0.398]
# Two pairwise claims on four cells whose per-seed differences are TWO − 0.2 and ONE − 5: their paired t-tests are
# the one-sample t-tests of TWO against 0.2 and of ONE against 5 (a metric of no known range against a number is no
# longer decided by a t-test: claims.location.no_range), on cells of their own.
FOUR = {
    "c1": ONE,
    "c2": [o + t - 0.2 for o, t in zip(ONE, TWO, strict=True)],
    "c3": [t + 5 for t in TWO],
    "c4": [t + o for t, o in zip(TWO, ONE, strict=True)],
}
PAIRS = ["score[loops=2] > score[loops=1]", "score[loops=4] > score[loops=3]"]


def four(counts: dict[str, int]) -> StudyData:
    return study({c: v[: counts[c]] for c, v in FOUR.items()}, PAIRS)


def test_a_look_decides_at_its_nominal_level_and_adds_seeds_only_to_the_undecided_claims_cells():
    design = sequential.Design(2, 5, 1)
    first = sequential.take_look(four(dict.fromkeys(FOUR, 2)), design, [])
    a, b = first.claims
    assert a.state == b.state == "sampling" and a.analysed and a.fraction == pytest.approx(2 / 5)
    assert a.nominal == pytest.approx(sequential.nominal_level((0.4,), design.level)) and a.p_claimed > a.nominal
    assert b.p_opposite < 0.01 and b.p_opposite > b.nominal  # one degree of freedom: not below 0.0019 yet
    assert first.next_seeds == dict.fromkeys(FOUR, 3)
    looks = [first]
    looks.append(sequential.take_look(four(dict.fromkeys(FOUR, 3)), design, looks))
    a, b = looks[1].claims
    assert a.state == "sampling" and b.state == "contradicted" and b.decided_at == 2 and b.p_opposite < b.nominal
    assert b.p_sequential < 0.05 and looks[1].wave == {"c1": 1, "c2": 1}  # only claim a's cells sample on
    looks.append(sequential.take_look(four({"c1": 4, "c2": 4, "c3": 3, "c4": 3}), design, looks))
    a = looks[2].claims[0]
    assert a.state == "supported" and a.decided_at == 3 and a.fraction == pytest.approx(4 / 5)
    assert a.p_claimed < a.nominal < sequential.ALPHA
    assert looks[2].claims[1] == replace(b, analysed=False)  # decided: carried as it was
    assert looks[2].final and looks[2].next_seeds == looks[2].seeds == {"c1": 4, "c2": 4, "c3": 3, "c4": 3}


def test_the_last_possible_look_spends_what_is_left_and_a_claim_that_cannot_reach_its_effect_is_futile():
    flat = {
        "c1": [0.3, 0.5, 0.4, 0.45, 0.35],
        "c2": [0.52, 0.31, 0.41, 0.44, 0.36],
    }  # no ties: the t-test decides (a tie at an extreme would take the exact test, which cannot reach 0.05 by 4 seeds)
    text = "eval_accuracy[loops=2] > eval_accuracy[loops=1]"

    def run(min_effect: float, design) -> list:
        def draw(seeds):
            return study({c: v[: seeds[c]] for c, v in flat.items()}, [text])

        return sequential.run_sequential(draw, design, ["c1", "c2"], specs=[(text, min_effect)])

    design = sequential.Design(2, 3, 1)
    ended = run(5.0, design)  # a large smallest effect of interest: few seeds would find it, so it samples to max
    (c,) = ended[-1].claims
    assert [look.number for look in ended] == [1, 2] and c.state == "inconclusive" and c.decided_at == 2
    assert c.fraction == 1.0 and c.nominal == pytest.approx(sequential.nominal_level((2 / 3, 1.0), design.level))
    assert c.p_sequential > sequential.ALPHA
    # an effect no seed count within max could show: sampled to 4 seeds (no futility stop before), then no more
    futile = run(0.001, sequential.Design(2, 5, 1))
    (c,) = futile[-1].claims
    assert [look.number for look in futile] == [1, 2, 3] and c.state == "futile" and c.seeds == 4
    assert (c.needed is None or c.needed > 5) and "futile" in c.detail and futile[-1].final
    assert [cl.state for look in futile[:2] for cl in look.claims] == ["sampling", "sampling"]


def test_a_look_without_a_new_seed_with_a_value_is_not_analysed_again():
    design = sequential.Design(2, 5, 1)
    claims = ["score[loops=2] > score[loops=1]"]
    first = sequential.take_look(study({"c1": ONE[:2], "c2": TWO[:2]}, claims), design, [])
    diverged = study({"c1": ONE[:2] + [0.3], "c2": TWO[:2] + [math.nan]}, claims)
    second = sequential.take_look(diverged, design, [first])
    assert not second.claims[0].analysed and second.claims[0].state == "sampling"
    assert "no new seed" in second.claims[0].detail


def test_rows_round_trip_and_verify_reports_the_look_that_decided():
    design = sequential.Design(2, 5, 1)
    claims = PAIRS
    looks = sequential.run_sequential(four, design, list(FOUR))
    rows = [
        {**sequential.look_row(look, design), "texts": claims, "claims": [sequential.claim_row(c) for c in look.claims]}
        for look in looks
    ]
    for row in rows:  # the ledger stores no NaN
        row["claims"] = [
            {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in c.items()}
            for c in row["claims"]
        ]
    again = sequential.looks_from_rows(rows)
    assert [(c.state, c.decided_at, c.seeds) for c in again[-1].claims] == [
        (c.state, c.decided_at, c.seeds) for c in looks[-1].claims
    ]
    data = four({"c1": 4, "c2": 4, "c3": 3, "c4": 3})
    data.sequential, data.looks = {"start": 2, "max": 5, "step": 1}, rows
    supported, contradicted = sequential.verify(data, holm=True)
    assert (
        supported.verdict == "supported" and supported.extra["look"] == 3 and "supported at look 3" in supported.detail
    )
    assert supported.p == pytest.approx(looks[-1].claims[0].p_sequential) and supported.p < 0.05
    assert contradicted.verdict == "contradicted" and contradicted.verdict_holm == "contradicted"
    # a seed rerun later (other data in the ledger) changes no decided look: verify reads the rows
    data.trials = frame({"c1": [0.1, 0.1, 0.2], "c2": [0.1, 0.12, 0.11, 0.1], "c3": [1, 2, 3], "c4": [3, 2, 1]})
    assert [v.verdict for v in sequential.verify(data)] == ["supported", "contradicted"]


def test_the_calibrated_level_holds_a_sequential_t_test_at_alpha_where_the_normal_boundaries_do_not():
    """t-statistics at few degrees of freedom cross the normal-theory nominal levels a little more often than a
    normal statistic would; the design's calibrated level brings a one-sample t-test back to α (an independent
    simulation from the one that calibrated it)."""
    from scipy.stats import t as student

    rng = np.random.default_rng(123)
    for start, most in ((2, 8), (3, 12)):
        seeds = np.arange(start, most + 1)
        fractions = tuple(seeds / most)
        x = rng.standard_normal((40_000, most))
        p = np.stack([student.sf(x[:, :n].mean(1) / (x[:, :n].std(1, ddof=1) / math.sqrt(n)), n - 1) for n in seeds], 1)

        def rate(level: float, p=p, fractions=fractions) -> float:
            return float(np.mean(np.any(p < norm.sf(np.array(sequential.boundaries(fractions, level))), axis=1)))

        calibrated = sequential.Design(start, most, 1).level
        assert calibrated < sequential.ALPHA and rate(sequential.ALPHA) > 0.052  # uncalibrated: above α
        assert abs(rate(calibrated) - sequential.ALPHA) < 0.0035  # 3 Monte-Carlo standard errors


def test_without_a_min_effect_a_claim_is_futile_when_its_trend_cannot_cross_by_max():
    design = sequential.Design(4, 12, 1)
    text = "eval_accuracy[loops=2] > eval_accuracy[loops=1]"
    flat = {"c1": [0.40, 0.41, 0.39, 0.42], "c2": [0.41, 0.39, 0.40, 0.415]}  # no difference at all
    look = sequential.take_look(study(flat, [text]), design, [])
    (c,) = look.claims
    assert c.state == "futile" and "conditional power" in c.detail and look.final
    clear = {"c1": [0.40, 0.41, 0.39, 0.42], "c2": [0.45, 0.47, 0.44, 0.46]}  # a clear trend: more seeds
    (c,) = sequential.take_look(study(clear, [text]), design, []).claims
    assert c.state == "sampling"
    # the same flat trend at 3 seeds: not judged yet (no futility stop before MIN_FUTILITY_SEEDS seeds per side)
    early = {k: v[:3] for k, v in flat.items()}
    (c,) = sequential.take_look(study(early, [text]), sequential.Design(3, 12, 1), []).claims
    assert c.state == "sampling" and sequential.MIN_FUTILITY_SEEDS == 4


def test_a_decided_claim_is_described_with_the_seeds_of_the_look_that_decided_it():
    """Seen in faithful_melt_teacher: a claim decided at look 1 (3 seeds) was printed at the end as 'supported at
    look 1, 4 seeds' because its cells went on to a 4th seed for another claim."""
    decided = sequential.ClaimLook(index=1, claim="a > b", state="supported", decided_at=1, seeds=3, cells=["c1"])
    assert sequential.describe_state(decided, {"c1": 4}) == "claim 2 supported at look 1, 3 seeds"
    open_claim = sequential.ClaimLook(index=0, claim="a > b", state="undecided", seeds=3, cells=["c1"])
    assert sequential.describe_state(open_claim, {"c1": 4}) == "claim 1 undecided, 4 seeds"
