"""Declared claims and the failure rule: grammar, validation, and each claim type on a synthetic ledger."""

import math

import numpy as np
import pytest
from analysis_ledger import build, loglinear_outcome, study_text
from typer.testing import CliRunner

from studyrunner.analysis import claims as claims_mod
from studyrunner.analysis import data as data_mod
from studyrunner.analysis import stats
from studyrunner.cli import app
from studyrunner.study import compile_study, loads
from studyrunner.study.claims_grammar import GrammarError, parse_claim, parse_rule

runner = CliRunner()


def output(result) -> str:
    """stdout and stderr (Click 8.2+ keeps both in `output`)."""
    return result.output


# --- grammar -------------------------------------------------------------------------------------


def test_claim_grammar_parses_the_issue_examples():
    c = parse_claim("eval_exact_match[memory_slots=0] < eval_exact_match[memory_slots=8]")
    assert (c.lhs.kind, c.lhs.metric, c.lhs.selector, c.op) == ("mean", "eval_exact_match", (("memory_slots", 0),), "<")
    c = parse_claim("failure_rate[halt_bias_init=0] > failure_rate[halt_bias_init=-3]")
    assert c.rhs.kind == "failure_rate" and c.rhs.selector == (("halt_bias_init", -3),)
    c = parse_claim("slope(eval_accuracy ~ ln effective_depth)[family=looped] > 0")
    assert (c.lhs.kind, c.lhs.x, c.lhs.log_x, c.lhs.selector) == (
        "slope",
        "effective_depth",
        True,
        (("family", "looped"),),
    )
    c = parse_claim("iqm(eval_accuracy)[model.params.loops=4, cell='loops=4 x'] >= 1e-1")
    assert c.lhs.selector == (("model.params.loops", 4), ("cell", "loops=4 x")) and c.rhs.value == 0.1


@pytest.mark.parametrize(
    "text,position,fragment",
    [
        ("eval_accuracy[loops=4 < 0.5", 23, "expected ',' or ']'"),
        ("eval_accuracy == 0.5", 15, "compare with <, >"),
        ("__import__('os').system('true') > 0", 17, "unexpected character"),
        ("__import__('os') > 0", 1, "unknown function"),
        ("eval_accuracy - 1 > 0", 15, "arithmetic"),
        ("0.5 < 0.7", 1, "a metric"),
        ("failure_rate[loops=1] > eval_accuracy", 1, "failure_rate can only be compared"),
        ("slope(eval_accuracy ~ ln) > 0", 23, "regressor"),
        ("eval_accuracy[loops=1, loops=2] > 0", 24, "twice"),
        ("eval_accuracy > 0.5 extra", 21, "expected the end"),
    ],
)
def test_bad_claims_name_the_position(text, position, fragment):
    with pytest.raises(GrammarError) as exc:
        parse_claim(text)
    assert exc.value.position == position
    assert fragment in str(exc.value)


def test_failure_rule_semantics():
    rule = parse_rule("eval_exact_match < 0.2 or halt_collapsed")
    assert rule.metrics == ["eval_exact_match", "halt_collapsed"]
    assert not rule({"eval_exact_match": 0.5})
    assert rule({"eval_exact_match": 0.1})
    assert rule({"eval_exact_match": 0.5, "halt_collapsed": 1.0})
    assert not rule({"eval_exact_match": 0.5, "halt_collapsed": 0.0})
    assert rule({"eval_exact_match": float("nan")})  # a NaN metric (diverged) fails
    assert not rule({})  # a metric the trial does not report makes its comparison false
    assert parse_rule("not (a >= 1 and b != 2)")({"a": 1, "b": 2})
    for bad in ("a <", "a > 1 or", "import os", "a > b", "a.b > 1", "(a > 1"):
        with pytest.raises(GrammarError):
            parse_rule(bad)


def test_validate_rejects_a_bad_claim_naming_index_line_and_position(tmp_path):
    text = study_text(
        extra='claims:\n  - "eval_accuracy[loops=8] > eval_accuracy[loops=1]"\n  - "eval_accuracy[loops=4 < 0.5"\n'
    )
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    line = text.splitlines().index('  - "eval_accuracy[loops=4 < 0.5"') + 1
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    assert f"bad.yaml:{line}: claims[1]: position 23:" in message
    path.write_text(study_text(extra='failure: "eval_accuracy <"\n'))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and "failure: position 16: expected a number" in output(result)


def test_claims_and_failure_rule_do_not_change_any_cell_hash():
    plain = compile_study(loads(study_text()))
    extra = 'failure: "eval_accuracy < 0.2"\nclaims:\n  - "eval_accuracy[loops=8] > eval_accuracy[loops=1]"\n'
    declared = compile_study(loads(study_text(extra=extra)))
    assert declared.study.claims and declared.study.failure
    assert [c.cell_hash for c in plain.cells] == [c.cell_hash for c in declared.cells]
    assert [t.trial_key for t in plain.trials] == [t.trial_key for t in declared.trials]


# --- each claim type on a synthetic ledger ---------------------------------------------------------


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory):
    root = tmp_path_factory.mktemp("claims")

    def failing(params, seed):  # loops=1 x 1 block fails (3 by the rule, 1 crashes); loops=8 never does
        base = loglinear_outcome()(params, seed)
        if params["loops"] == 1 and params["block_layers"] == 1:
            return None if seed == 3 else {**base, "eval_accuracy": 0.1}
        return base

    noisy = {1: [0.5, 0.6, 0.4, 0.55], 2: [0.61, 0.45, 0.55, 0.5], 4: [0.5, 0.5, 0.6, 0.4], 8: [0.45, 0.6, 0.5, 0.5]}

    def noise(params, seed):
        return {"eval_accuracy": noisy[params["loops"]][seed]}

    return {
        "clean": data_mod.load(str(build(root / "clean", loglinear_outcome())[2]), workspace=root / "clean"),
        "failing": data_mod.load(
            str(build(root / "failing", failing, extra='failure: "eval_accuracy < 0.2"\n')[2]),
            workspace=root / "failing",
        ),
        "noisy": data_mod.load(str(build(root / "noisy", noise)[2]), workspace=root / "noisy"),
    }


HOLDS_AND_FAILS = [
    # (ledger, claim that holds, claim that fails)
    ("clean", "eval_accuracy[loops=8, block_layers=1] > eval_accuracy[loops=1, block_layers=1]",
     "eval_accuracy[loops=8, block_layers=1] < eval_accuracy[loops=1, block_layers=1]"),  # paired t
    ("clean", "eval_accuracy[loops=8] > eval_accuracy[loops=1]", "eval_accuracy[loops=8] <= eval_accuracy[loops=1]"),
    # an accuracy against a number: decided where the t-test and the distribution-free gate agree (seeds ~0.3)
    ("clean", "eval_accuracy[loops=1] > 0.05", "eval_accuracy[loops=1] > 0.9"),
    ("clean", "0.05 < eval_accuracy[loops=1]", "0.9 < eval_accuracy[loops=1]"),
    ("clean", "iqm(eval_accuracy)[loops=4, block_layers=1] > 0.4", "iqm(eval_accuracy)[loops=4, block_layers=1] > 0.5"),
    ("clean", "slope(eval_accuracy ~ ln effective_depth)[block_layers=1] > 0.05",
     "slope(eval_accuracy ~ ln effective_depth)[block_layers=1] < 0.05"),
    ("clean", "slope(eval_accuracy ~ loops)[block_layers=2] > 0", "slope(eval_accuracy ~ loops)[block_layers=2] < 0"),
    ("clean", "slope(eval_accuracy ~ ln loops)[block_layers=2] > slope(eval_accuracy ~ ln loops)[block_layers=1]",
     "slope(eval_accuracy ~ ln loops)[block_layers=2] < slope(eval_accuracy ~ ln loops)[block_layers=1]"),
    ("failing", "failure_rate[loops=1, block_layers=1] > failure_rate[loops=8]",
     "failure_rate[loops=1, block_layers=1] < failure_rate[loops=8]"),  # Fisher, 4/4 vs 0/8
    ("failing", "failure_rate[loops=8] < 0.6", "failure_rate[loops=1, block_layers=1] < 0.3"),
]  # fmt: skip


@pytest.mark.parametrize("name,holds,fails", HOLDS_AND_FAILS)
def test_each_claim_type_holds_and_fails(ledgers, name, holds, fails):
    data = ledgers[name]
    good, bad = claims_mod.evaluate(data, holds), claims_mod.evaluate(data, fails)
    assert good.verdict == "supported", good
    assert bad.verdict == "contradicted", bad
    assert good.lo <= good.estimate <= good.hi or good.test.startswith("Wilson")


def test_medians_from_few_seeds_have_no_interval(ledgers):
    """No distribution-free 95% interval of a median exists below 6 values, and a bootstrap of 4 seeds is
    not one: median claims on a few seeds are inconclusive, and say why, rather than 'supported'."""
    one = claims_mod.evaluate(ledgers["clean"], "median(eval_accuracy)[loops=4, block_layers=1] >= 0.4")
    two = claims_mod.evaluate(ledgers["clean"], "median(eval_accuracy)[loops=2] < median(eval_accuracy)[loops=4]")
    assert one.verdict == two.verdict == "inconclusive"
    assert "decides nothing below 5 seeds" in one.test and "no interval below 10 seeds" in two.detail
    assert one.p == pytest.approx(0.5**4)  # the sign test's smallest p at 4 seeds
    assert stats.median_interval(np.arange(8.0)) == (0.0, 7.0)  # 8 values: the extremes give 99.2%


def test_failures_count_crashes_and_the_rule(ledgers):
    cells = stats.cell_stats(ledgers["failing"]).set_index("cell")
    row = cells.loc["loops=1 block_layers=1"]
    assert (row.failures, row.seeds_done) == (4, 4)  # 3 by the rule, 1 crashed (no metrics)
    assert row.n == 3  # the crashed seed reported nothing
    verdict = claims_mod.evaluate(ledgers["failing"], "failure_rate[loops=1, block_layers=1] > failure_rate[loops=8]")
    assert "4/4 vs 0/8" in verdict.detail and "Fisher" in verdict.detail


def test_overlapping_seeds_are_inconclusive(ledgers):
    v = claims_mod.evaluate(
        ledgers["noisy"], "eval_accuracy[loops=2, block_layers=1] > eval_accuracy[loops=1, block_layers=1]"
    )
    assert v.verdict == "inconclusive" and v.test.startswith("paired") and v.lo < 0 < v.hi


@pytest.mark.parametrize(
    "claim,reason",
    [
        ("eval_accuracy[memory_slots=0] > 0.1", "no config field 'memory_slots'"),
        ("eval_accuracy[loops=3] > 0.1", "no finished trial matches"),
        ("no_such_metric[loops=1] > 0", "no trial reported 'no_such_metric'"),
        ("eval_accuracy[loops=1 > 0", "position"),
    ],
)
def test_claims_the_study_cannot_answer_are_invalid(ledgers, claim, reason):
    v = claims_mod.evaluate(ledgers["clean"], claim)
    assert v.verdict == "invalid" and reason in v.detail


def test_verify_command_exit_codes_and_literal_claims(tmp_path):
    holds = "eval_accuracy[loops=8, block_layers=1] > eval_accuracy[loops=1, block_layers=1]"
    fails = "eval_accuracy[loops=8, block_layers=1] < eval_accuracy[loops=1, block_layers=1]"
    _, _, path = build(tmp_path, loglinear_outcome(), extra=f'claims:\n  - "{holds}"\n')
    result = runner.invoke(app, ["verify", "synth", "--workspace", str(tmp_path)])
    assert result.exit_code == 0, output(result)
    assert "supported" in result.output and "[loops=8, block_layers=1]" in result.output  # brackets printed as written
    # claims added to the study file since it was submitted: verify FILE uses them (no resubmit needed)
    path.write_text(study_text(extra=f'claims:\n  - "{holds}"\n  - "{fails}"\n'))
    result = runner.invoke(app, ["verify", str(path), "--workspace", str(tmp_path), "--format", "csv"])
    assert result.exit_code == 1
    assert "contradicted" in result.output and "supported" in result.output


def test_analysis_of_a_running_or_extended_study_counts_missing_trials(tmp_path):
    _, _, path = build(tmp_path, loglinear_outcome(), leave_pending=3)
    data = data_mod.load("synth", workspace=tmp_path)
    assert data.missing == 3 and len(data.done) == 29
    assert stats.cell_stats(data).missing.sum() == 3
    extended = tmp_path / "extended.yaml"
    extended.write_text(study_text().replace("seeds: [0, 1, 2, 3]", "seeds: [0, 1, 2, 3, 4]"))
    data = data_mod.load(str(extended), workspace=tmp_path)
    assert data.missing == 3 + 8  # the 3 pending, and seed 4 of every cell
    result = runner.invoke(app, ["analyze", "synth", "--workspace", str(tmp_path)])
    assert result.exit_code == 0, output(result)
    assert "3 trials missing" in result.output


def test_analysis_commands_on_a_missing_workspace_are_one_line_and_create_nothing(tmp_path):
    missing = tmp_path / "typo"
    for args in (["analyze", "synth"], ["verify", "synth"], ["report", "synth"]):
        result = runner.invoke(app, [*args, "--workspace", str(missing)])
        assert result.exit_code == 1 and "no results ledger" in result.output and "Traceback" not in result.output
    assert not missing.exists()


@pytest.mark.parametrize("drop_seed", [None, 3])
def test_a_slope_over_two_depths_agrees_with_the_pairwise_claim(drop_seed):
    """A slope over two depths and the same contrast as a pairwise claim must not disagree (the quickstart's
    slope claim once read 'supported' beside an 'inconclusive' pairwise claim). Over two depths with every seed
    at both, CR2 by seed is the paired t: the same interval (over ln 4) and verdict. With a seed missing at one
    depth, the estimate lies inside its own interval (both from the one fit; the paired interval beside the
    fit's estimate did not)."""
    from benchmarks.coverage import sample

    frame = sample([1, 4], 4, np.random.default_rng(3))
    if drop_seed is not None:  # a seed missing at one depth
        frame = frame[~((frame.seed == drop_seed) & (frame.effective_depth == 4))]
    data = data_mod.from_frame(frame, metric="y")
    slope = claims_mod.evaluate(data, "slope(y ~ ln effective_depth) > 0")
    pair = claims_mod.evaluate(data, "y[loops=4] > y[loops=1]")
    assert "CR2 t by seed" in slope.test and "paired t" in pair.test
    assert slope.lo <= slope.estimate <= slope.hi
    if drop_seed is None:
        assert (slope.lo * math.log(4), slope.hi * math.log(4)) == pytest.approx((pair.lo, pair.hi))
        assert slope.verdict == pair.verdict and slope.p == pytest.approx(pair.p)


def test_a_stored_study_file_this_version_cannot_read_is_named_not_taken_for_no_claims(tmp_path):
    """A ledger written by another studyrunner may hold a study file today's schema rejects: `verify NAME`
    says so and how to mend it, instead of 'declares no claims' (its claims are unknown, not absent)."""
    import sqlite3

    db, _, _ = build(tmp_path, loglinear_outcome(), extra='claims: ["eval_accuracy[loops=8] > 0.1"]\n')
    with sqlite3.connect(tmp_path / "ledger.db") as con:
        con.execute("UPDATE studies SET spec_text = spec_text || 'a_field_from_the_future: 1\n'")
    data = data_mod.load("synth", db=db, workspace=tmp_path)
    assert data.spec_error and "does not load with this studyrunner" in data.spec_error
    assert data.spec_error in data.warnings and data.claims == []
    result = runner.invoke(app, ["verify", "synth", "--db", db, "--workspace", str(tmp_path)])
    assert result.exit_code != 0
    assert "pass the study file instead of the name" in output(result)
    assert "declares no claims" not in output(result)


@pytest.mark.parametrize("spelling", [None, "None"])
def test_an_unset_field_is_selected_alike_in_the_compiled_config_and_in_the_ledgers_table(spelling):
    """Seen in faithful_loops_memory: `mlp_hidden=None` matched the unset cells when `validate` read the compiled
    configs (None) but none when `verify` read the ledger's table, where the column other cells set holds NaN:
    every claim that named it was invalid at the first look, for good."""
    from studyrunner.study.claims_grammar import values_equal

    assert values_equal(None, spelling) and values_equal(float("nan"), spelling)
    assert not values_equal(545, spelling) and not values_equal(545.0, spelling) and not values_equal(0, spelling)
