"""Threats to a claim's validity (analysis/claims/validity.py): each raised where the data show it and not where they
do not, on synthetic ledgers (a real study registered, outcomes and curves written directly; no training)."""

from __future__ import annotations

import json
import math

import pytest
from analysis_ledger import build
from typer.testing import CliRunner

from studyrunner.analysis import claims as analysis_claims
from studyrunner.analysis import data as analysis_data
from studyrunner.analysis.claims import validity
from studyrunner.cli import app
from studyrunner.tasks import build_task

CHANCE = 0.25  # p-hop over an alphabet of 4 (analysis_ledger's study)


def study(tmp_path, outcome, curve=None, extra="", name="synth"):
    _, _, path = build(tmp_path, outcome, name=name, extra=extra, curve=curve)
    return analysis_data.load(name, workspace=tmp_path)


def threats_of(data, claim):
    verdict = analysis_claims.evaluate(data, claim)
    return {str(t.threat): t.detail for t in validity.assess(data, claim, verdict)}, verdict


def accuracy(values: dict):
    """Outcome: eval_accuracy by (loops, block_layers), with a little seed spread."""

    def outcome(params, seed):
        base = values.get((params["loops"], params["block_layers"]), 0.5)
        jitter = 0.004 * ((seed * 7) % 5 - 2) + 0.003 * math.sin(seed * 12.9898 + params["loops"] * 78.233)
        return {"eval_accuracy": min(1.0, base + jitter), "eval_loss": 1.0}

    return outcome


def test_the_task_declares_the_levels_the_threats_read():
    levels = build_task("phop", {"alphabet": 4, "seq_len": 12, "hops": 1}, 0).metric_levels(512)
    assert levels["eval_accuracy"].chance == pytest.approx(CHANCE) and levels["eval_accuracy"].best == 1.0
    assert levels["eval_loss"].higher_is_better is False and levels["eval_loss"].best == 0.0
    sudoku = build_task("sudoku", {"size": 4, "givens": 6}, 0).metric_levels(256)["eval_accuracy"]
    assert sudoku.chance == pytest.approx(0.25) and sudoku.floor > 0.5  # the givens pin many cells down
    assert "givens allow" in sudoku.floor_strategy


def test_ceiling_is_raised_for_sides_at_the_top_and_not_below_it(tmp_path):
    data = study(tmp_path, accuracy({(4, 1): 0.999, (2, 1): 0.996, (8, 1): 0.7, (1, 1): 0.6}))
    found, _ = threats_of(data, "eval_accuracy[loops=4, block_layers=1] > eval_accuracy[loops=2, block_layers=1]")
    assert "ceiling" in found and "perfect score 1" in found["ceiling"], found
    found, _ = threats_of(data, "eval_accuracy[loops=8, block_layers=1] > eval_accuracy[loops=1, block_layers=1]")
    assert "ceiling" not in found and "floor" not in found, found


def test_floor_is_raised_at_chance_and_not_above_it(tmp_path):
    data = study(tmp_path, accuracy({(1, 1): 0.252, (2, 1): 0.45}))
    found, _ = threats_of(data, "eval_accuracy[loops=2, block_layers=1] > eval_accuracy[loops=1, block_layers=1]")
    assert "floor" in found and "chance (0.25)" in found["floor"] and "rhs" in found["floor"], found
    found, _ = threats_of(data, "eval_accuracy[loops=2, block_layers=1] > 0.3")
    assert "floor" not in found, found


def rising(late: dict):
    """Curves of eval_accuracy at steps 25, 50, 75, 100 ending at the final value; cells in `late` still rise
    by that much over the last half, the others are flat there."""

    def curve(params, seed):
        final = accuracy(FINALS)(params, seed)["eval_accuracy"]
        rise = late.get((params["loops"], params["block_layers"]), 0.0)
        jitter = 0.002 * ((seed * 3) % 3 - 1)
        values = [final - 1.6 * rise - 0.05, final - rise + jitter, final - rise / 2 - jitter, final]
        return [{"step": s, "eval_accuracy": v} for s, v in zip((25, 50, 75, 100), values, strict=True)]

    return curve


FINALS = {(4, 1): 0.62, (1, 1): 0.55, (2, 1): 0.60}


def test_unconverged_is_raised_when_the_trailing_side_still_climbs_enough_to_change_the_verdict(tmp_path):
    data = study(tmp_path, accuracy(FINALS), curve=rising({(1, 1): 0.15}))
    found, verdict = threats_of(data, "eval_accuracy[loops=4, block_layers=1] > eval_accuracy[loops=1, block_layers=1]")
    assert verdict.verdict == "supported", verdict
    assert "unconverged" in found and "rhs eval_accuracy still rising" in found["unconverged"], found


def test_unconverged_is_not_raised_for_converged_curves_nor_for_a_move_the_verdict_survives(tmp_path):
    converged = study(tmp_path / "a", accuracy(FINALS), curve=rising({}))
    found, _ = threats_of(converged, "eval_accuracy[loops=4, block_layers=1] > eval_accuracy[loops=1, block_layers=1]")
    assert "unconverged" not in found, found
    small = study(tmp_path / "b", accuracy(FINALS), curve=rising({(1, 1): 0.03}))  # still rising a little
    found, _ = threats_of(small, "eval_accuracy[loops=4, block_layers=1] > eval_accuracy[loops=1, block_layers=1]")
    assert "unconverged" not in found, found


def test_a_slope_claim_is_unconverged_only_where_the_moves_could_change_its_verdict(tmp_path):
    """The quickstart's case: the deepest cell still rising makes the depth slope steeper, which a supported
    `slope > 0` survives; the shallowest cell still rising flattens it and could undo it."""
    finals = {(1, 1): 0.40, (2, 1): 0.52, (4, 1): 0.60, (8, 1): 0.66}
    claim = "slope(eval_accuracy ~ ln effective_depth)[block_layers=1] > 0"
    deep = study(tmp_path / "a", accuracy(finals), curve=rising({(8, 1): 0.1}))
    found, verdict = threats_of(deep, claim)
    assert verdict.verdict == "supported" and "unconverged" not in found, found
    shallow = study(tmp_path / "b", accuracy(finals), curve=rising({(1, 1): 0.5}))
    found, verdict = threats_of(shallow, claim)
    assert verdict.verdict == "supported", verdict
    assert "unconverged" in found and "[loops=1 block_layers=1] still rising" in found["unconverged"], found
    assert "the slope's interval" in found["unconverged"] and "read" in found["unconverged"], found


INCLUDE = """include:
  - {model.params: {d_model: 16, n_heads: 2, block_layers: 4, loops: 1, norm: rmsnorm}, train.lr: 3.0e-3}
"""


def test_confound_lists_every_unnamed_field_that_differs(tmp_path):
    data = study(tmp_path, accuracy({(1, 4): 0.7, (4, 1): 0.65}), extra=INCLUDE)
    found, _ = threats_of(data, "eval_accuracy[block_layers=4, loops=1] > eval_accuracy[block_layers=1, loops=4]")
    assert "confound" in found, found
    assert "train.lr" in found["confound"] and "model.params.norm" in found["confound"], found
    assert "model.params.loops" not in found["confound"]  # named by the claim


def test_matched_arms_carry_no_confound_and_matched_properties_are_checked(tmp_path):
    data = study(tmp_path, accuracy({(4, 1): 0.7, (1, 1): 0.6}))
    claim = "eval_accuracy[loops=4, block_layers=1] > eval_accuracy[loops=1, block_layers=1]"
    found, _ = threats_of(data, claim)
    assert "confound" not in found and "unmatched" not in found, found
    entry = {"claim": claim, "matched": ["steps", "lr", "params"]}
    verdict = analysis_claims.evaluate(data, claim)
    found = {str(t.threat): t.detail for t in validity.assess(data, entry, verdict)}
    assert "unmatched" in found and "params: not recorded" in found["unmatched"], found  # synthetic: no params
    assert "steps" not in found["unmatched"] and "lr" not in found["unmatched"]


def test_unmatched_parameters_are_named_with_their_ratio(tmp_path):
    def outcome(params, seed):
        return {"eval_accuracy": 0.6 + 0.01 * seed, "params": 1000.0 * params["block_layers"]}

    data = study(tmp_path, outcome)
    claim = "eval_accuracy[loops=1, block_layers=2] > eval_accuracy[loops=2, block_layers=1]"
    entry = {"claim": claim, "matched": ["params"]}
    found = {str(t.threat): t.detail for t in validity.assess(data, entry, analysis_claims.evaluate(data, claim))}
    assert "unmatched" in found and "2.00x" in found["unmatched"], found


def test_selection_is_raised_for_a_best_of_many_scored_where_it_was_ranked(tmp_path):
    def outcome(params, seed, heldout=None):
        out = {"eval_accuracy": 0.6, "eval_loss_budget_2_min": 1.0 - 0.1 * params["loops"] + 0.01 * seed}
        return out if heldout is None else {**out, "selection_heldout": heldout}

    claim = "eval_loss_budget_2_min[loops=4, block_layers=1] < eval_loss_budget_2_min[loops=1, block_layers=1]"
    old = study(tmp_path / "old", outcome)
    found, _ = threats_of(old, claim)
    assert "selection" in found, found
    new = study(tmp_path / "new", lambda p, s: outcome(p, s, heldout=1.0))
    found, _ = threats_of(new, claim)
    assert "selection" not in found, found


def test_verify_shows_the_threats_and_strict_fails_on_them(tmp_path):
    extra = 'claims:\n  - "eval_accuracy[loops=4, block_layers=1] > eval_accuracy[loops=2, block_layers=1]"\n'
    build(tmp_path, accuracy({(4, 1): 0.999, (2, 1): 0.97}), extra=extra)
    runner = CliRunner()
    result = runner.invoke(app, ["verify", "synth", "--workspace", str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["verdict"] == "supported" and [t["threat"] for t in row["validity"]] == ["ceiling"], row
    assert row["threats"] == "ceiling"
    shown = runner.invoke(app, ["verify", "synth", "--workspace", str(tmp_path)])
    assert "claim 1: ceiling:" in shown.stdout, shown.output
    strict = runner.invoke(app, ["verify", "synth", "--workspace", str(tmp_path), "--strict"])
    assert strict.exit_code == 1 and "--strict" in strict.output, strict.output
