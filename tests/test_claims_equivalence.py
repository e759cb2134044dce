"""Equivalence (`A ~= B`) and non-inferiority (`A >= B` with a margin) claims: the grammar
and study-file forms, what `validate` refuses, the two one-sided tests and their interval, and their decisions at a
sequential look. The level and power by simulation: benchmarks/equivalence.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from analysis_ledger import study_text
from scipy import stats as sps
from typer.testing import CliRunner

from studyrunner.analysis import claims, sequential
from studyrunner.analysis.data import StudyData, annotate
from studyrunner.cli import app
from studyrunner.study import loads
from studyrunner.study.claim_entries import ClaimEntry
from studyrunner.study.claims_grammar import EQUIVALENT, parse_claim

runner = CliRunner()
A = [0.512, 0.486, 0.530, 0.471, 0.505, 0.498]  # seeds 0-5 of arm 0
D = [0.011, -0.008, 0.004, 0.015, -0.012, 0.006]  # arm 1 − arm 0 per seed: close to 0


def frame(cells: dict[str, list[float]], metric: str = "eval_accuracy") -> pd.DataFrame:
    rows = []
    for cell, ys in cells.items():
        arm = int(cell[-1])
        for seed, y in enumerate(ys):
            rows.append(
                {"trial_key": f"{cell}-s{seed}", "cell_hash": cell, "cell": f"arm={arm}", "seed": seed,
                 "status": "succeeded", "model.params.arm": arm, "model.params.loops": 1, "effective_depth": 1.0,
                 "baseline_of": "", metric: y}
            )  # fmt: skip
    return annotate(pd.DataFrame(rows), None)


MQAR = {"task": {"name": "mqar", "params": {}}, "eval": {"examples": 64}}


def study(cells: dict[str, list[float]], claims_=(), metric: str = "eval_accuracy") -> StudyData:
    data = StudyData("s", frame(cells, metric), metric=metric, claims=list(claims_), cells_order=list(cells))
    data.cell_configs = dict.fromkeys(cells, MQAR)  # the task declares eval_accuracy's range, [0, 1]
    return data


def pair(d=D, n: int = 6) -> StudyData:
    return study({"c0": A[:n], "c1": [a + x for a, x in zip(A[:n], d[:n], strict=True)]})


EQ = "eval_accuracy[arm=1] ~= eval_accuracy[arm=0]"


# ---------------------------------------------------------------------------------------------- the forms


def test_the_grammar_reads_tilde_equals_and_the_approximately_sign_as_one_operator():
    for text in (EQ, "eval_accuracy[arm=1] ≈ eval_accuracy[arm=0]", "eval_accuracy[arm=1]~=0.5"):
        assert parse_claim(text).op == EQUIVALENT
    assert parse_claim("0.5 ≈ eval_accuracy[arm=1]").op == EQUIVALENT


def test_claim_entries_take_a_margin_and_the_properties_both_sides_match():
    entry = ClaimEntry.model_validate({"claim": EQ, "margin": 0.02, "matched": ["params", "steps"]})
    assert (entry.margin, entry.matched) == (0.02, ["params", "steps"])
    assert entry.model_dump() == {"claim": EQ, "margin": 0.02, "matched": ["params", "steps"]}
    assert ClaimEntry.model_validate(EQ).model_dump() == EQ  # a bare entry is written back as its string


def _validate(tmp_path, entry: str):
    path = tmp_path / "study.yaml"
    path.write_text(study_text(extra=f"claims:\n  - {entry}\n"))
    return runner.invoke(app, ["validate", str(path)])


L4, L1 = "eval_accuracy[loops=4]", "eval_accuracy[loops=1]"


@pytest.mark.parametrize(
    "entry,fragment",
    [
        (f'"{L4} ~= {L1}"', "claims[0].margin: "),
        (f'{{claim: "{L4} ~= {L1}", margin: 0}}', "claims[0].margin: Input should be greater than 0"),
        (f'{{claim: "{L4} ~= {L1}", margin: -0.1}}', "claims[0].margin: Input should be greater than 0"),
        (f'{{claim: "{L4} ~= {L1}", margin: 1.5}}', "claims[0].margin: 1.5 is a difference of eval_accuracy"),
        (f'{{claim: "{L4} > {L1}", margin: 0.05}}', "claims[0].margin: a margin goes with >= or <="),
        (f'{{claim: "{L4} ~= {L1}", margin: 0.05, min_effect: 0.01}}', "claims[0].min_effect: an equivalence claim"),
        ('{claim: "failure_rate[loops=4] >= failure_rate[loops=1]", margin: 0.1}', "claims[0].margin: no exact test"),
        (f'{{claim: "{L4} >= {L1}", margin: 0.02, matched: [params, depth]}}', "claims[0].matched: 'depth' cannot be"),
    ],
)
def test_validate_refuses_a_margin_or_matched_field_it_cannot_use_in_one_line(tmp_path, entry, fragment):
    result = _validate(tmp_path, entry)
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and fragment in message, message


@pytest.mark.parametrize(
    "entry",
    [
        '{claim: "eval_accuracy[loops=4] ~= eval_accuracy[loops=1]", margin: 0.02}',
        f'{{claim: "{L4} ≈ {L1}", margin: 0.02, matched: [params, flops, steps, lr]}}',
        '{claim: "eval_accuracy[loops=4] >= eval_accuracy[loops=1]", margin: 0.02}',
        '{claim: "eval_loss[loops=4] <= eval_loss[loops=1]", margin: 0.1}',
        '"eval_accuracy[loops=4] >= eval_accuracy[loops=1]"',
    ],
)
def test_validate_accepts_equivalence_and_non_inferiority_entries(tmp_path, entry):
    result = _validate(tmp_path, entry)
    assert result.exit_code == 0, result.output


def test_validate_warns_that_a_margin_claim_needs_five_seeds_a_side(tmp_path):
    # the study has 4 seeds; a margin is decided from 5 (`_margin_floor`): say so before anything runs
    result = _validate(tmp_path, '{claim: "eval_loss[loops=4] <= eval_loss[loops=1]", margin: 0.1}')
    assert result.exit_code == 0, result.output
    assert "claims[0] cannot be decided with 4 seeds; it needs 5" in result.output + result.stderr
    plain = _validate(tmp_path, '"eval_loss[loops=4] <= eval_loss[loops=1]"')
    assert "cannot be decided" not in plain.output + plain.stderr


def test_a_study_file_keeps_every_field_of_an_entry():
    text = study_text(
        extra=f'claims:\n  - {{claim: "{EQ.replace("arm", "loops")}", margin: 0.02, matched: [params]}}\n'
    )
    (entry,) = loads(text).claims
    assert entry.margin == 0.02 and entry.matched == ["params"]


# ---------------------------------------------------------------------------------------------- the tests


def _paired_t(d, null, alternative):
    return sps.ttest_1samp(d, null, alternative=alternative).pvalue


def test_equivalence_is_two_one_sided_tests_and_its_interval_lies_inside_the_margin_exactly_when_supported():
    v = claims.evaluate(pair(), {"claim": EQ, "margin": 0.03})
    d = np.array(D)
    lower, upper = _paired_t(d, -0.03, "greater"), _paired_t(d, 0.03, "less")
    assert v.verdict == "supported" and v.p == pytest.approx(max(lower, upper))
    assert -0.03 < v.lo < v.hi < 0.03 and v.estimate == pytest.approx(d.mean())
    half = sps.t.ppf(0.95, 5) * d.std(ddof=1) / math.sqrt(6)  # the 90% interval: 1 − 2α
    assert (v.lo, v.hi) == pytest.approx((d.mean() - half, d.mean() + half))
    assert "TOST" in v.test and v.interval_label == "fixed 90%" and v.margin == 0.03
    # a margin the interval does not fit inside: inconclusive (neither shown)
    v = claims.evaluate(pair(), {"claim": EQ, "margin": 0.01})
    assert v.verdict == "inconclusive" and v.lo < 0.01 < v.hi
    # a difference shown to lie beyond the margin: contradicted (the interval lies outside [−δ, δ])
    far = pair([x + 0.05 for x in D])
    v = claims.evaluate(far, {"claim": EQ, "margin": 0.02})
    assert v.verdict == "contradicted" and v.lo > 0.02 and v.p == pytest.approx(_paired_t(d + 0.05, 0.02, "greater"))
    # the operator is symmetric: the number side, the ≈ spelling
    v = claims.evaluate(pair(), {"claim": "eval_accuracy[arm=0] ≈ eval_accuracy[arm=1]", "margin": 0.03})
    assert v.verdict == "supported"


def test_an_equivalence_claim_without_a_margin_is_invalid_at_verify():
    v = claims.evaluate(pair(), EQ)
    assert v.verdict == "invalid" and "margin" in v.detail


def test_non_inferiority_tests_the_difference_against_minus_the_margin():
    d = np.array(D) - 0.01  # arm 1 a little worse
    data = pair(list(d))
    text = "eval_accuracy[arm=1] >= eval_accuracy[arm=0]"
    plain = claims.evaluate(data, text)  # no margin: read as `>`
    assert plain.verdict in ("inconclusive", "contradicted") and plain.margin is None
    v = claims.evaluate(data, {"claim": text, "margin": 0.03})
    assert v.verdict == "supported" and v.lo > -0.03 and v.p == pytest.approx(_paired_t(d, -0.03, "greater"))
    assert v.estimate == pytest.approx(d.mean()) and "non-inferiority by 0.03" in v.test
    # shown worse by more than the margin: contradicted (the upper bound below −δ)
    worse = pair(list(d - 0.05))
    v = claims.evaluate(worse, {"claim": text, "margin": 0.03})
    assert v.verdict == "contradicted" and v.hi < -0.03
    # `<=`: the mirror (a loss not higher by more than the margin)
    v = claims.evaluate(data, {"claim": "eval_accuracy[arm=0] <= eval_accuracy[arm=1]", "margin": 0.03})
    assert v.verdict == "supported" and v.hi < 0.03


def test_equivalence_with_a_number_on_an_accuracy_needs_both_distribution_free_gates():
    seeds = [0.62, 0.61, 0.63, 0.60, 0.62, 0.61]
    near = study({"c0": seeds})
    v = claims.evaluate(near, {"claim": "eval_accuracy[arm=0] ~= 0.615", "margin": 0.05})
    # the t-tests alone pass; the bets on the seeds against 0.565 and 0.665 need more than 6 seeds
    assert all(t < 0.05 for t, _ in v.extra["tests"]["claimed"]) and v.verdict == "inconclusive"
    assert "held back by the distribution-free bound" in v.detail
    loss = study({"c0": seeds}, metric="score")  # no known range: no test of a mean against a number
    v = claims.evaluate(loss, {"claim": "score[arm=0] ~= 0.615", "margin": 0.05})
    assert v.verdict == "inconclusive" and "no known range" in v.detail


def test_a_margin_on_seeds_that_fail_or_learn_is_not_decided():
    fail = [0.25, 0.95, 0.96, 0.94, 0.25, 0.95]
    data = study({"c0": fail, "c1": [0.95, 0.25, 0.95, 0.94, 0.96, 0.25]})
    v = claims.evaluate(data, {"claim": EQ, "margin": 0.1})
    assert v.verdict == "inconclusive" and "margin" in v.detail and math.isnan(v.lo)
    # with no margin the exact sign-flip test decides a difference of such seeds, as before
    v = claims.evaluate(data, "eval_accuracy[arm=1] > eval_accuracy[arm=0]")
    assert "sign-flip" in v.test


# ------------------------------------------------------------------------------------------- sequential


def test_a_sequential_look_decides_equivalence_when_both_one_sided_tests_cross_its_nominal_level():
    design = sequential.Design(2, 8, 1)
    entry = ClaimEntry(claim=EQ, margin=0.03)
    first = sequential.take_look(pair(n=3), design, [], specs=[entry])
    (c,) = first.claims
    assert c.state == "sampling" and c.p_claimed > c.nominal  # 3 seeds: not yet at O'Brien-Fleming's level
    looks = [first]
    for n in (4, 5, 6):
        looks.append(sequential.take_look(pair(n=n), design, looks, specs=[entry]))
        if looks[-1].final:
            break
    (c,) = looks[-1].claims
    assert c.state == "supported", [cl.detail for look in looks for cl in look.claims]
    v = claims.evaluate(pair(n=c.seeds), entry, alpha=c.nominal)  # the claim's own TOST at the look's level
    assert max(t for t, _ in v.extra["tests"]["claimed"]) == pytest.approx(c.p_claimed) and c.p_claimed < c.nominal
    assert -0.03 < c.lo < c.hi < 0.03  # its repeated confidence interval, at the nominal level


def test_an_equivalence_claim_whose_interval_cannot_shrink_inside_the_margin_stops_for_futility():
    design = sequential.Design(4, 8, 1)
    noisy = [0.05, -0.06, 0.07, -0.04]  # a spread no 8 seeds can squeeze inside ±0.01
    (c,) = sequential.take_look(pair(noisy, 4), design, [], specs=[ClaimEntry(claim=EQ, margin=0.01)]).claims
    assert c.state == "futile" and "equivalence would be shown by max with probability" in c.detail
    tight = [0.002, -0.001, 0.003, -0.002]
    (c,) = sequential.take_look(pair(tight, 4), design, [], specs=[ClaimEntry(claim=EQ, margin=0.01)]).claims
    assert c.state in ("sampling", "supported")


def test_a_margin_is_decided_from_five_seeds_per_side_where_a_second_mode_shows():
    """At 2-4 seeds that all fell in one mode, two cells whose failure rates differ look alike: false equivalence
    ran at 0.13-0.22 on such seeds (benchmarks/equivalence.py). Below 5 seeds a margin claim stays inconclusive."""
    entry = {"claim": EQ, "margin": 0.03}
    v = claims.evaluate(pair(n=4), entry)
    assert v.verdict == "inconclusive" and all(t < 0.05 for t, _ in v.extra["tests"]["claimed"])
    assert "a margin is decided from 5 seeds per side; 4 so far" in v.detail and -0.03 < v.lo < v.hi < 0.03
    assert claims.evaluate(pair(n=5), entry).verdict == "supported"
    # a sequential look does not cross below 5 seeds either, and says why
    wide = ClaimEntry(claim=EQ, margin=0.06)
    (c,) = sequential.take_look(pair(n=4), sequential.Design(4, 8, 1), [], specs=[wide]).claims
    assert c.state == "sampling" and c.p_claimed < c.nominal and "decided from 5 seeds" in c.detail
    (c,) = sequential.take_look(pair(n=5), sequential.Design(5, 8, 1), [], specs=[wide]).claims
    assert c.state == "supported"
    # a failure rate or a median against a number takes a margin at any count: their exact tests hold on any seeds
    data = study({"c0": [0.5, 0.52, 0.49]})
    v = claims.evaluate(data, {"claim": "median(eval_accuracy)[arm=0] >= 0.55", "margin": 0.1})
    assert "decided from 5" not in v.detail


def test_a_margin_in_a_study_whose_failure_rule_says_seeds_may_fail_is_not_decided():
    from studyrunner.study.claims_grammar import parse_rule

    data = pair()
    data.failure_rule = parse_rule("eval_accuracy < 0.3")  # no seed failed: a failure mode may hide
    data.trials = annotate(data.trials.drop(columns=["failed"]), data.failure_rule)
    v = claims.evaluate(data, {"claim": EQ, "margin": 0.03})
    assert v.verdict == "inconclusive" and "failure rule" in v.detail and math.isnan(v.lo)
    assert claims.evaluate(data, EQ.replace("~=", ">")).verdict != "invalid"  # no margin: decided as before
