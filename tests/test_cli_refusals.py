"""Filters that would silently mean "everything" or crash the parser are refused in one line."""

import pytest
from analysis_ledger import build, loglinear_outcome
from typer.testing import CliRunner

from studyrunner.cli import app
from studyrunner.spec.claims_grammar import MAX_DEPTH, GrammarError, parse_rule

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
