"""Filters that would silently mean "everything" or crash the parser are refused in one line."""

import pytest
from analysis_ledger import build, loglinear_outcome, study_text
from typer.testing import CliRunner

from studyrunner.cli import app
from studyrunner.study.claims_grammar import MAX_DEPTH, GrammarError, parse_rule

runner = CliRunner()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("refusals")
    build(root, loglinear_outcome())
    return root


def _one_line_error(result, fragment: str) -> None:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output and "RecursionError" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0], result.output


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--seeds", ""], "--seeds '' names no seed"),
        (["--seeds", " , "], "names no seed"),
        (["--cell", ""], "--cell '' names no cell"),
        (["--cell", "  "], "names no cell"),
    ],
)
def test_rerun_refuses_empty_seeds_and_cells(workspace, args, fragment):
    result = runner.invoke(app, ["rerun", "synth", *args, "--workspace", str(workspace)])
    _one_line_error(result, fragment)
    assert result.exit_code == 2  # a value that cannot be read, as click's own usage errors


def test_rerun_reads_a_seed_given_twice_as_given_once(workspace):
    once = runner.invoke(app, ["rerun", "synth", "--seeds", "0", "--workspace", str(workspace), "--no-progress"])
    twice = runner.invoke(app, ["rerun", "synth", "--seeds", "0,0", "--workspace", str(workspace), "--no-progress"])
    assert once.exit_code == twice.exit_code == 0, (once.output, twice.output)
    assert "seeds 0)" in once.output and "seeds 0)" in twice.output, twice.output


def test_rerun_names_the_registered_seeds_of_an_unknown_one(workspace):
    result = runner.invoke(app, ["rerun", "synth", "--seeds", "7", "--workspace", str(workspace)])
    _one_line_error(result, "--seeds: 7 is not a seed of study 'synth' (0-3)")


@pytest.mark.parametrize("where", ["loops >", "nosuchfield > 1", "(eval_accuracy > 0"])
def test_results_where_errors_are_usage_errors(workspace, where):
    result = runner.invoke(app, ["results", "synth", "--where", where, "--workspace", str(workspace)])
    _one_line_error(result, "--where")
    assert result.exit_code == 2


@pytest.mark.parametrize("verb", [["db", "upgrade"], ["status"], ["results", "synth"]])
def test_a_ledger_url_naming_a_folder_is_named_as_such(tmp_path, verb):
    (tmp_path / "dir.db").mkdir()
    result = runner.invoke(app, [*verb, "--db", f"sqlite:///{tmp_path / 'dir.db'}"])
    _one_line_error(result, "is a folder, not a ledger file")


@pytest.mark.parametrize(
    "where",
    [
        "(" * 400 + "eval_accuracy > 0" + ")" * 400,
        "not " * 240 + "eval_accuracy > 0",
        "(" * 2000 + "eval_accuracy > 0" + ")" * 2000,
    ],
)
def test_results_where_refuses_deep_nesting_in_one_line(workspace, where):
    result = runner.invoke(app, ["results", "synth", "--where", where, "--workspace", str(workspace)])
    _one_line_error(result, "--where")


def test_rule_nesting_limit_is_exact():
    assert parse_rule("(" * MAX_DEPTH + "a > 0" + ")" * MAX_DEPTH)({"a": 1})
    assert parse_rule("not " * MAX_DEPTH + "a > 0")({"a": 1})  # an even number of nots
    with pytest.raises(GrammarError, match="nested more than"):
        parse_rule("(" * (MAX_DEPTH + 1) + "a > 0" + ")" * (MAX_DEPTH + 1))
    with pytest.raises(GrammarError, match="nested more than"):
        parse_rule("not " * (MAX_DEPTH + 1) + "a > 0")


# --- validate: claims the study cannot answer ------------------------------------------------------


@pytest.mark.parametrize(
    "claim,fragment",
    [
        ("eval_acuracy[loops=4] > eval_accuracy[loops=1]", "no trial of this study reports metric 'eval_acuracy'"),
        ("eval_accuracy_budget_4 > 0.5", "reports metric 'eval_accuracy_budget_4'"),  # no eval.budgets
        ("eval_accuracy[memory_slots=4] > 0.5", "no config field 'memory_slots' to select on"),
        ("eval_accuracy[loops=3] > eval_accuracy[loops=1]", "no cell has loops=3"),
        ("eval_accuracy[family=melt] > 0.5", "no cell has family='melt'"),
        ("eval_accuracy[loops=4, seed=9] > 0.5", "no cell has seed=9"),
        ("eval_accuracy[cell='loops=3 block_layers=1'] > 0.5", "no cell has cell="),
        ("eval_accuracy > inf", "numbers must be finite"),
        ("eval_accuracy > -inf", "numbers must be finite"),
        ("nan < eval_accuracy", "numbers must be finite"),
        ("eval_accuracy[loops=nan] > 0", "must be finite"),
        ("eval_accuracy > 1e999", "numbers must be finite"),
        ("failure_rate[loops=4] < 2", "a number in [0, 1]"),
        ("eval_accuracy[loops=4] > eval_accuracy[loops=4]", "both sides are the same quantity of the same cells"),
        ("eval_accuracy[loops=4] > eval_accuracy[model.params.loops=4]", "the same quantity of the same cells"),
    ],
)
def test_validate_rejects_claims_the_study_cannot_answer(tmp_path, claim, fragment):
    path = tmp_path / "study.yaml"
    path.write_text(study_text(extra=f'claims:\n  - "eval_accuracy[loops=4] > 0.1"\n  - "{claim}"\n'))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "claims[1]" in message and fragment in message, message


@pytest.mark.parametrize(
    "effect,claim",
    [
        ("5", "eval_accuracy[loops=4] > eval_accuracy[loops=1]"),
        ("1e308", "eval_accuracy[loops=4] > eval_accuracy[loops=1]"),
        ("1", "eval_accuracy[loops=4] > 0.3"),
        ("1.5", "failure_rate[loops=1] > failure_rate[loops=8]"),
    ],
)
def test_validate_refuses_a_min_effect_the_claims_scale_cannot_hold(tmp_path, effect, claim):
    path = tmp_path / "study.yaml"
    path.write_text(study_text(extra=f'claims:\n  - {{claim: "{claim}", min_effect: {effect}}}\n'))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "claims[0].min_effect" in message and "below 1" in message, message


def test_validate_accepts_a_min_effect_inside_the_scale(tmp_path):
    path = tmp_path / "study.yaml"
    claim = "eval_accuracy[loops=4] > eval_accuracy[loops=1]"
    path.write_text(study_text(extra=f'claims:\n  - {{claim: "{claim}", min_effect: 0.05}}\n'))
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0


@pytest.mark.parametrize(
    "claim",
    [
        "eval_loss[loops=8, block_layers=2] < eval_loss[model.params.loops=1]",
        "eval_accuracy[family=looped, task=phop, seed=0, cell='loops=2 block_layers=1'] > 0.1",
        "slope(eval_accuracy ~ ln effective_depth)[block_layers=1] > 0",
        "failure_rate[loops=1] > failure_rate[loops=8]",
        "train_loss[loops=4.0] < 3",
    ],
)
def test_validate_accepts_claims_the_study_can_answer(tmp_path, claim):
    path = tmp_path / "study.yaml"
    path.write_text(study_text(extra=f'claims:\n  - "{claim}"\n'))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output


def test_every_shipped_study_validates():
    from pathlib import Path

    for path in sorted(Path(__file__).parents[1].joinpath("studies").glob("*.yaml")):
        result = runner.invoke(app, ["validate", str(path)])
        assert result.exit_code == 0, (path, result.output)


@pytest.mark.parametrize(
    "verb,text",
    [
        ("submit", "Folder or URI for curves, checkpoints and Ray results"),
        ("rerun", "Folder or URI for curves, checkpoints and Ray results"),
        ("analyze", "Folder or URI of the curves"),
    ],
)
def test_each_verb_describes_its_own_storage_option(verb, text):
    """The analysis verbs' narrower --storage help once replaced every verb's (one module, one name)."""
    result = runner.invoke(app, [verb, "--help"], env={"COLUMNS": "300", "TERMINAL_WIDTH": "300"})
    assert result.exit_code == 0, result.output
    assert text in " ".join(result.output.split()), result.output


def test_help_shows_the_environment_variables_and_defaults_of_options():
    """Option help carries "[env ...; default: ...]": rich markup once swallowed it as a tag."""
    from typer.testing import CliRunner

    from studyrunner.cli import app

    text = " ".join(CliRunner().invoke(app, ["submit", "--help"]).output.split())
    assert "[env STUDYRUNNER_DB; default: SQLite in the workspace]" in text
    assert "[env RAY_ADDRESS; default: start a local Ray]" in text
