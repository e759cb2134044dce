"""Sequential verdicts a reviewer can accept: a futility stop reads as inconclusive,
never a tie; no futility stop before 4 seeds; the graphical group-sequential Holm design (`multiplicity: holm`); the
information of a side pooling several cells; the bimodality switch from 5 seeds; repeated confidence intervals
labelled as such. Each test fails on the code before the fix. Level and power by simulation: benchmarks/futility.py,
holm.py, skewed.py, bimodality.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from studyrunner.analysis import claims, sequential
from studyrunner.analysis.claims.evidence import BIMODAL_FROM
from studyrunner.analysis.data import StudyData, annotate
from studyrunner.analysis.present import verdicts_table
from studyrunner.analysis.sequential import claim_row
from studyrunner.cli import app
from studyrunner.study.claim_entries import ClaimEntry


def frame(cells: dict[str, list[float]], groups: dict[str, int] | None = None) -> pd.DataFrame:
    rows = []
    for cell, ys in cells.items():
        arm = int(cell[1:])
        for seed, y in enumerate(ys):
            rows.append(
                {"trial_key": f"{cell}-s{seed}", "cell_hash": cell, "cell": f"arm={arm}", "seed": seed,
                 "status": "succeeded", "model.params.arm": arm, "model.params.group": (groups or {}).get(cell, arm),
                 "model.params.loops": 1, "effective_depth": 1.0, "baseline_of": "", "eval_accuracy": y}
            )  # fmt: skip
    return annotate(pd.DataFrame(rows), None)


def study(cells, texts=(), groups=None) -> StudyData:
    return StudyData("s", frame(cells, groups), claims=list(texts), cells_order=list(cells))


def rows_of(looks, design, texts):
    out = []
    for look in looks:
        row = {**sequential.look_row(look, design), "texts": list(texts)}
        row["claims"] = [
            {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in claim_row(c).items()}
            for c in look.claims
        ]
        out.append(row)
    return out


def verified(looks, design, data: StudyData, texts) -> list:
    data.sequential = {"start": design.start, "max": design.max, "step": design.step}
    data.looks = rows_of(looks, design, texts)
    return sequential.verify(data)


FLAT = {"c0": [0.40, 0.41, 0.39, 0.42, 0.40, 0.41], "c1": [0.41, 0.395, 0.40, 0.415, 0.405, 0.40]}  # no ties
PAIR = "eval_accuracy[arm=1] > eval_accuracy[arm=0]"


# ------------------------------------------------------------------------------------------- futility


def test_a_futility_stop_prints_as_inconclusive_stopped_for_futility_with_its_interval_never_a_tie():
    design = sequential.Design(4, 12, 1)
    data = study({c: v[:4] for c, v in FLAT.items()}, [PAIR])
    look = sequential.take_look(data, design, [])
    (c,) = look.claims
    assert c.state == "futile"  # the ledger's state
    line = sequential.describe_state(c, look.seeds)
    assert "inconclusive (stopped for futility) at look 1, 4 seeds, interval [" in line
    assert "repeated-confidence" in line
    assert "tie" not in line and " futile " not in f" {line} "
    (v,) = verified([look], design, data, [PAIR])
    assert v.verdict == "inconclusive" and v.stopped == "futility"
    assert v.shown_verdict == "inconclusive (stopped for futility)" and v.lo < 0 < v.hi
    row = claims.verdict_table([v]).to_dict("records")[0]
    assert row["verdict"] == "inconclusive" and row["stopped"] == "futility"  # machine-readable
    assert json.loads(claims.verdict_table([v]).to_json(orient="records"))[0]["stopped"] == "futility"
    assert "stopped for futility at look 1" in v.detail and "no tie" in v.detail
    from rich.console import Console

    console = Console(width=400, record=True)
    console.print(verdicts_table([v]))
    assert "inconclusive (stopped for futility)" in console.export_text()


def test_a_sequential_verdict_states_both_sides_on_the_seeds_its_look_used():
    """The report's and verify's lhs / rhs columns were empty for a sequential study: its look rows keep only the
    difference. Seeds added after the deciding look (a later rerun) do not move them."""
    design = sequential.Design(4, 12, 1)
    data = study({c: v[:4] for c, v in FLAT.items()}, [PAIR])
    look = sequential.take_look(data, design, [])
    later = study({"c0": FLAT["c0"] + [0.9], "c1": FLAT["c1"] + [0.1]}, [PAIR])
    (v,) = verified([look], design, later, [PAIR])
    assert v.lhs == pytest.approx(np.mean(FLAT["c1"][:4])) and v.rhs == pytest.approx(np.mean(FLAT["c0"][:4]))


def test_no_claim_is_stopped_for_futility_before_four_seeds_per_side():
    for start in (2, 3):
        data = study({c: v[:start] for c, v in FLAT.items()}, [PAIR])
        (c,) = sequential.take_look(data, sequential.Design(start, 12, 1), []).claims
        assert c.state == "sampling", (start, c.detail)  # before: futile at 2 and 3 seeds on a flat trend
    data = study({c: v[:4] for c, v in FLAT.items()}, [PAIR])
    (c,) = sequential.take_look(data, sequential.Design(4, 12, 1), []).claims
    assert c.state == "futile"


# ------------------------------------------------------------------------------------ pooled information


def test_a_side_pooling_several_cells_has_the_information_of_its_seeds_not_its_trials():
    """Counting trials, n / (cells x max), would make a pooled side's fraction 7/16 at 7 of 8 seeds (nominal 0.002)."""
    rng = np.random.default_rng(0)
    cells = {f"c{i}": list(0.5 + rng.normal(0, 0.05, 8)) for i in range(3)}
    groups = {"c0": 0, "c1": 0, "c2": 1}  # the rhs pools two cells
    text = "eval_accuracy[group=1] > eval_accuracy[group=0]"
    design = sequential.Design(2, 8, 1, futility_effect="none")
    looks = sequential.run_sequential(
        lambda counts: study({c: v[: counts[c]] for c, v in cells.items()}, [text], groups), design, list(cells)
    )
    at_seven = next(cl for look in looks for cl in look.claims if look.seeds["c0"] == 7)
    assert at_seven.fraction == pytest.approx(7 / 8)
    assert at_seven.nominal == pytest.approx(sequential.nominal_level(tuple(k / 8 for k in range(2, 8)), design.level))
    assert at_seven.nominal > 0.02  # 0.024, not 0.002


# ---------------------------------------------------------------------------------------- bimodality


def test_three_seeds_are_never_read_as_bimodal_so_the_paired_t_decides():
    """Three seeds of one cell [0.40, 0.401, 0.60]: two close by chance. Read as bimodal they swapped the paired t
    for a sign-flip whose smallest p is 0.125."""
    data = study({"c0": [0.40, 0.401, 0.60], "c1": [0.46, 0.462, 0.655]})
    v = claims.evaluate(data, PAIR)
    assert "paired t" in v.test and v.verdict == "supported", (v.test, v.detail)
    assert BIMODAL_FROM == 5
    five = study({"c0": [0.25, 0.26, 0.95, 0.94, 0.96], "c1": [0.27, 0.28, 0.96, 0.95, 0.97]})
    assert "sign-flip" in claims.evaluate(five, PAIR).test  # from 5 seeds, two modes are read as such


# ------------------------------------------------------------------------------------------- labels


def test_fixed_and_repeated_confidence_intervals_are_labelled_with_their_levels():
    data = study({c: v[:4] for c, v in FLAT.items()}, [PAIR])
    fixed = claims.evaluate(data, PAIR)
    assert fixed.interval_label == "fixed 90%"
    row = claims.verdict_table([fixed]).to_dict("records")[0]
    assert row["interval_kind"] == "fixed" and row["confidence"] == pytest.approx(0.9)
    assert math.isnan(row["nominal_confidence"]) and row["interval_label"] == "fixed 90%"
    design = sequential.Design(4, 12, 1)
    look = sequential.take_look(data, design, [])
    (v,) = verified([look], design, data, [PAIR])
    nominal = look.claims[0].nominal
    assert v.interval_kind == "repeated" and v.nominal == pytest.approx(nominal)
    row = claims.verdict_table([v]).to_dict("records")[0]
    assert row["interval_kind"] == "repeated-confidence" and row["nominal_confidence"] == pytest.approx(1 - 2 * nominal)
    assert row["interval_label"].startswith("repeated-confidence 90% (nominal 99.")
    from rich.console import Console

    console = Console(width=400, record=True)
    console.print(verdicts_table([fixed, v]))
    text = console.export_text()
    assert "(fixed 90%)" in text and "(repeated-confidence 90% (nominal" in text


# ----------------------------------------------------------------------------------------------- Holm


TWO = ["eval_accuracy[arm=1] > eval_accuracy[arm=0]", "eval_accuracy[arm=3] > eval_accuracy[arm=2]"]


def _holm_cells():
    base = np.array([0.512, 0.486, 0.530, 0.471, 0.505, 0.498, 0.5, 0.49])
    rng = np.random.default_rng(3)
    return {
        "c0": list(base),
        "c1": list(base + 0.08 + rng.normal(0, 0.01, 8)),  # clear
        "c2": list(base),
        "c3": list(base + 0.012 + rng.normal(0, 0.012, 8)),  # marginal
    }


def test_the_holm_design_starts_each_claim_at_an_equal_share_and_passes_a_decided_claims_share_on():
    cells = _holm_cells()

    def draw(counts):
        return study({c: v[: counts[c]] for c, v in cells.items()}, TWO)

    holm = sequential.run_sequential(draw, sequential.Design(2, 8, 1), list(cells), specs=TWO, multiplicity="holm")
    plain = sequential.run_sequential(draw, sequential.Design(2, 8, 1), list(cells), specs=TWO)
    first = holm[0].claims
    assert [c.weight for c in first] == [0.5, 0.5] and holm[0].multiplicity == "holm"
    level = sequential.Design(2, 8, 1, alpha=0.025).level  # the boundaries at half of alpha
    assert first[0].nominal == pytest.approx(sequential.nominal_level((2 / 8,), level))
    decided = next(look for look in holm if look.claims[0].state == "supported")
    # the look that decides claim 1 re-tests claim 2 at the whole alpha: its nominal level is the plain design's
    other = decided.claims[1]
    twin = next(look for look in plain if look.number == decided.number).claims[1]
    assert other.weight == 1.0 and other.nominal == pytest.approx(twin.nominal)
    # claim 1 needed more than the plain design: it crosses later (or at a smaller p)
    first_plain = next(look.number for look in plain if look.claims[0].state == "supported")
    assert decided.number >= first_plain
    # the weights survive the ledger's rows, and verify says what each was decided at
    rows = rows_of(holm, sequential.Design(2, 8, 1), TWO)
    assert rows[0]["design"]["multiplicity"] == "holm" and rows[0]["design"]["holm_weights"] == [0.5, 0.5]
    assert [c.weight for c in sequential.looks_from_rows(rows)[-1].claims] == [0.5, 1.0]
    data = draw(holm[-1].seeds)
    data.sequential, data.looks = {"start": 2, "max": 8, "step": 1}, rows
    v1, _ = sequential.verify(data)
    assert v1.verdict == "supported" and v1.alpha == 0.025 and "Holm share 0.5" in v1.test
    assert v1.interval_label.startswith("repeated-confidence 95%") and v1.p < 0.05


def test_holm_re_tests_the_others_at_the_same_look_when_one_is_decided():
    """Claim 2's p lies between its nominal level at half of alpha and at the whole: it is supported at the look
    that decides claim 1, not before."""
    design = sequential.Design(4, 4, 1)  # one look at max: the fixed test, nominal = the level
    d1 = [0.09, 0.1, 0.11, 0.1]  # clear
    d2 = [0.03, 0.005, 0.045, 0.021]  # one-sided p between 0.025 and 0.05
    base = [0.5, 0.48, 0.52, 0.49]
    data = study(
        {"c0": base, "c1": [b + x for b, x in zip(base, d1, strict=True)],
         "c2": base, "c3": [b + x for b, x in zip(base, d2, strict=True)]}, TWO)  # fmt: skip
    p2 = claims.evaluate(data, TWO[1]).p
    assert 0.025 < p2 < 0.05
    (a, b) = sequential.take_look(data, design, [], specs=TWO, multiplicity="holm").claims
    assert a.state == "supported" and b.state == "supported" and b.weight == 1.0
    lone = [TWO[1], "eval_accuracy[arm=2] > eval_accuracy[arm=0]"]  # the other claim is not rejected (no effect)
    (b, a) = sequential.take_look(data, design, [], specs=lone, multiplicity="holm").claims
    assert b.state == "inconclusive" and b.weight == 0.5  # p2 > 0.025: at its half share it does not cross


def test_multiplicity_is_fixed_by_the_first_look():
    from conftest import TINY_STUDY

    from studyrunner.analysis.sequential import changed_claim_fields, claim_entries
    from studyrunner.study import loads

    claims_ = 'claims: ["eval_accuracy[loops=2] > 0.2"]\n'
    text = TINY_STUDY.replace("seeds: [0, 1]", "seeds: {start: 2, max: 4}") + claims_
    plain, holm = loads(text), loads(text + "multiplicity: holm\n")
    assert holm.multiplicity == "holm" and plain.multiplicity is None
    recorded = {"claim_entries": claim_entries(plain), "multiplicity": "none"}
    assert changed_claim_fields(recorded, plain) == []
    assert changed_claim_fields(recorded, holm) == ["multiplicity"]


def test_verify_help_says_post_hoc_holm_on_sequential_p_values_is_nearly_powerless():
    result = CliRunner().invoke(app, ["verify", "--help"], env={"COLUMNS": "300"})
    flat = " ".join(result.output.split())
    assert "multiplicity: holm" in flat and "0.23" in flat and "0.655" in flat


def test_take_look_reads_entries_with_margins_and_old_style_specs_alike():
    data = study({c: v[:4] for c, v in FLAT.items()}, [PAIR])
    a = sequential.take_look(data, sequential.Design(4, 12, 1), [], specs=[(PAIR, None)])
    b = sequential.take_look(data, sequential.Design(4, 12, 1), [], specs=[ClaimEntry(claim=PAIR)])
    assert a.claims[0].state == b.claims[0].state and a.claims[0].p_claimed == b.claims[0].p_claimed


def test_an_exact_difference_decided_at_a_look_has_a_sequential_p_of_zero_not_one():
    """A metric every seed gives the same value (KV bytes per token) is decided exactly: one-sided p 0 at the look.
    Its sequential p was printed as 1 (p 0 read as unknown), beside the verdict supported."""
    design = sequential.Design(3, 5, 1)
    exact = {"c0": [512.0] * 3, "c1": [2048.0] * 3}
    data = study(exact, ["eval_accuracy[arm=1] > eval_accuracy[arm=0]"])
    look = sequential.take_look(data, design, [])
    (c,) = look.claims
    assert c.state == "supported" and c.p_claimed == 0.0 and c.p_sequential == 0.0, c
