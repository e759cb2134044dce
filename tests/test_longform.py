"""The queryable ledger: long-format tables trial_metrics and cell_params (written with the JSON columns,
and backfilled by migration 0003), the manual's SQL (docs/guide/ledger-sql.md) on SQLite and PostgreSQL,
and `results --where`."""

from __future__ import annotations

import json
import math
import re
import shlex
from io import StringIO
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import create_engine, select, text
from test_ledger import postgres_url  # noqa: F401 - a fixture: a throwaway PostgreSQL server
from typer.testing import CliRunner

from studyrunner import results
from studyrunner.cli import app
from studyrunner.errors import StudyrunnerError
from studyrunner.store import Ledger, longform
from studyrunner.store.db import Base, CellParamRow, CellRow, StudyRow, TrialMetricRow, TrialRow
from studyrunner.study import compile_study, flatten_config, loads

LEDGER_PAGE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "ledger-sql.md"
runner = CliRunner()

ALPHA = """\
name: alpha
task: {name: phop, params: {alphabet: 4, seq_len: 12, hops: 1}}
model: {family: looped, params: {d_model: 16, n_heads: 2, block_layers: 1, loops: 1}}
train: {steps: 100, batch_size: 16}
grid:
  model.params.loops: [1, 2, 4, 8]
seeds: [0, 1]
metric: {name: eval_accuracy, mode: max}
"""

# Another task (task.params.digits, which alpha lacks) and test-time depth (eval.loops, a list: `loops`
# must still mean model.params.loops).
BETA = """\
name: beta
task: {name: addition, params: {digits: 3}}
model: {family: looped, params: {d_model: 16, n_heads: 2, block_layers: 1, loops: 4}}
train: {steps: 100, batch_size: 16}
eval: {loops: [4, 8]}
grid:
  task.params.digits: [2, 3]
seeds: [0, 1]
metric: {name: eval_accuracy, mode: max}
"""


def accuracy(study: str, config: dict, seed: int) -> float:
    """Deterministic outcomes, distinct per trial: beta's digits=2 cell beats every alpha cell."""
    if study == "alpha":
        return 0.1 * math.log2(config["model"]["params"]["loops"]) + 0.3 + 0.01 * seed
    return 1.2 - 0.2 * config["task"]["params"]["digits"] + 0.01 * seed


def build(url: str) -> Ledger:
    """Both studies through the Ledger as a submit records them (no Ray). alpha loops=1 seed 1 fails,
    alpha loops=8 seed 0 diverges (with metrics), beta digits=3 seed 1 stays pending."""
    ledger = Ledger(url)
    for spec in (ALPHA, BETA):
        compiled = compile_study(loads(spec))
        ledger.register(compiled)
        for t in compiled.trials:
            loops, digits = t.config["model"]["params"]["loops"], t.config["task"]["params"].get("digits")
            if digits == 3 and t.seed == 1:
                continue
            ledger.mark_running(t.trial_key, f"run-{t.trial_key}")
            metrics = {
                "eval_accuracy": accuracy(compiled.study.name, t.config, t.seed),
                "eval_loss": 2.0 / loops,
                "halt_collapsed": loops == 8,  # a bool: 0/1 in trial_metrics
                "params": 1000 * loops,
                "note": "not a number",  # left out of trial_metrics
            }
            if loops == 1 and t.seed == 1 and compiled.study.name == "alpha":
                ledger.mark_failed(t.trial_key, "RuntimeError: synthetic crash\nTraceback ...")
            elif loops == 8 and t.seed == 0:
                ledger.finish(
                    t.trial_key, "diverged", metrics=metrics, error="loss diverged", failure_class="divergence"
                )
            else:
                ledger.mark_succeeded(t.trial_key, metrics)
    return ledger


def _drop_everything(url: str) -> None:
    engine = create_engine(url)
    Base.metadata.drop_all(engine)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    pg = request.getfixturevalue("postgres_url")
    _drop_everything(pg)  # a test that failed half-way leaves nothing behind for the next
    yield pg
    _drop_everything(pg)


@pytest.fixture
def sqlite_ledger(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    build(url)
    return url


# --- the long rows mirror the JSON columns --------------------------------------------------------


def long_metrics(ledger: Ledger) -> dict[str, dict[str, float | None]]:
    with ledger.session() as s:
        rows = s.scalars(select(TrialMetricRow)).all()
    found: dict[str, dict[str, float | None]] = {}
    for r in rows:
        found.setdefault(r.trial_key, {})[r.name] = r.value
    return found


def long_params(ledger: Ledger) -> dict[tuple[str, str], dict[str, tuple[str, float | None]]]:
    with ledger.session() as s:
        rows = s.scalars(select(CellParamRow)).all()
    found: dict[tuple[str, str], dict[str, tuple[str, float | None]]] = {}
    for r in rows:
        found.setdefault((r.study, r.cell_hash), {})[r.path] = (r.value, r.value_num)
    return found


def expected_params(config: dict) -> dict[str, tuple[str, float | None]]:
    """Written out from the rules, not through longform: JSON text, and the number when there is one."""
    out = {}
    for path, value in flatten_config(config).items():
        num = float(value) if isinstance(value, bool | int | float) else None
        out[path] = (json.dumps(value, sort_keys=True, separators=(",", ":")), num)
    return out


@pytest.mark.e2e
def test_long_rows_equal_the_json_columns(url):
    ledger = build(url)
    metrics = long_metrics(ledger)
    trials = {t.trial_key: t for study in ("alpha", "beta") for t in ledger.trials(study)}
    with_metrics = {k for k, t in trials.items() if t.metrics}
    assert set(metrics) == with_metrics and len(with_metrics) == 8 + 3 - 1  # one crash, one pending
    for key in with_metrics:
        stored = trials[key].metrics
        assert metrics[key] == {
            "eval_accuracy": pytest.approx(stored["eval_accuracy"]),
            "eval_loss": stored["eval_loss"],
            "halt_collapsed": float(stored["halt_collapsed"]),
            "params": float(stored["params"]),
        }
    with ledger.session() as s:
        studies = dict(s.execute(select(TrialMetricRow.trial_key, TrialMetricRow.study)).all())
    assert all(studies[k] == trials[k].study for k in studies)

    params = long_params(ledger)
    cells = {(c.study, c.cell_hash): c for study in ("alpha", "beta") for c in ledger.cells(study)}
    assert set(params) == set(cells) and len(cells) == 6
    for key, cell in cells.items():
        assert params[key] == expected_params(cell.config)
        assert {p: json.loads(v) for p, (v, _) in params[key].items()} == flatten_config(cell.config)
    beta_cell = next(k for k in cells if k[0] == "beta")
    assert params[beta_cell]["eval.loops"] == ("[4,8]", None)
    assert params[beta_cell]["model.family"] == ('"looped"', None)
    assert params[beta_cell]["task.params.reverse_answer"] == ("true", 1.0)


@pytest.mark.e2e
def test_writes_replace_the_rows_and_keep_numbers_only(url):
    ledger = build(url)
    key = next(t.trial_key for t in ledger.trials("alpha") if t.status == "succeeded")
    cell = ledger.cells("alpha")[0]
    with ledger.session() as s, s.begin():
        longform.write_metrics(s, "alpha", key, {"a": 1, "b": True, "c": float("nan"), "d": float("inf"), "e": "x"})
        longform.write_params(s, "alpha", cell.cell_hash, {"model": {"params": {"loops": 3}}, "tags": []})
    assert long_metrics(ledger)[key] == {"a": 1.0, "b": 1.0, "c": None, "d": None}
    assert long_params(ledger)[("alpha", cell.cell_hash)] == {"model.params.loops": ("3", 3.0), "tags": ("[]", None)}
    with ledger.session() as s, s.begin():
        longform.write_metrics(s, "alpha", key, None)  # no metrics: no rows
        longform.write_params(s, "alpha", cell.cell_hash, cell.config)  # the same twice: no duplicate rows
        longform.write_params(s, "alpha", cell.cell_hash, cell.config)
    assert key not in long_metrics(ledger)
    assert long_params(ledger)[("alpha", cell.cell_hash)] == expected_params(cell.config)


@pytest.mark.e2e
def test_registering_again_keeps_one_row_per_param(url):
    ledger = build(url)
    before = long_params(ledger)
    ledger.register(compile_study(loads(ALPHA)))
    assert long_params(ledger) == before


# --- the manual's SQL ---------------------------------------------------------------------------------


def readme_section() -> str:
    """The manual's page "Querying the ledger" (it moved there from the README, with these tests)."""
    return LEDGER_PAGE.read_text()


def readme_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", readme_section(), re.S)


def readme_query(marker: str) -> str:
    (query,) = [q for q in readme_blocks("sql") if marker in q]
    return query


def run_sql(url: str, query: str) -> list[tuple]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(query))]
    finally:
        engine.dispose()


def test_the_readme_has_the_three_queries_and_a_where_example():
    assert len(readme_blocks("sql")) == 3
    assert any("--where" in line for block in readme_blocks("bash") for line in block.splitlines())


@pytest.mark.e2e
def test_readme_query_best_cell_per_study(url):
    ledger = build(url)
    df = results.studies_frame(ledger)
    done = df[df.status == "succeeded"]
    means = done.groupby(["study", "cell"])["eval_accuracy"].agg(["mean", "count"]).reset_index()
    best = means.sort_values("mean", ascending=False).groupby("study").head(1).sort_values("study")
    rows = run_sql(url, readme_query("ROW_NUMBER"))
    assert [(s, c, n) for s, c, _, n in rows] == list(zip(best.study, best.cell, best["count"], strict=True))
    assert [m for _, _, m, _ in rows] == pytest.approx(list(best["mean"]))
    # alpha loops=8: its diverged seed is left out, the succeeded one (0.61) beats loops=4 (0.505)
    assert [(s, c, n) for s, c, _, n in rows] == [("alpha", "loops=8", 1), ("beta", "digits=2", 2)]


@pytest.mark.e2e
def test_readme_query_failed_seeds(url):
    build(url)
    rows = run_sql(url, readme_query("IN ('failed', 'diverged')"))
    assert [r[:5] for r in rows] == [
        ("alpha", "loops=1", 1, "failed", "error"),
        ("alpha", "loops=8", 0, "diverged", "divergence"),
    ]
    assert rows[0][5].startswith("RuntimeError: synthetic crash") and rows[1][5] == "loss diverged"


@pytest.mark.e2e
def test_readme_query_loops_against_accuracy(url):
    ledger = build(url)
    df = results.studies_frame(ledger)
    done = df[df.status == "succeeded"]
    expected = done.groupby(["study", "model.params.loops"])["eval_accuracy"].agg(["mean", "count"]).reset_index()
    rows = run_sql(url, readme_query("cell_params"))
    assert [(s, loops, n) for s, loops, _, n in rows] == [
        (s, float(loops), n)
        for s, loops, n in zip(expected.study, expected["model.params.loops"], expected["count"], strict=True)
    ]
    assert [m for _, _, m, _ in rows] == pytest.approx(list(expected["mean"]))
    assert [(s, loops) for s, loops, _, _ in rows] == [
        ("alpha", 1.0),
        ("alpha", 2.0),
        ("alpha", 4.0),
        ("alpha", 8.0),
        ("beta", 4.0),
    ]


# --- results --where --------------------------------------------------------------------------------


def cli(*args: str):
    return runner.invoke(app, ["results", *args])


def csv_keys(output: str) -> set[str]:
    return set(pd.read_csv(StringIO(output)).trial_key)


def expected_keys(ledger: Ledger, keep) -> set[str]:
    """Trial keys for which keep(flat config, metrics, seed) holds, read from the JSON columns."""
    found = set()
    for study in ("alpha", "beta"):
        cells = {c.cell_hash: c.config for c in ledger.cells(study)}
        for t in ledger.trials(study):
            if keep(flatten_config(cells[t.cell_hash]), t.metrics or {}, t.seed):
                found.add(t.trial_key)
    return found


def test_the_readme_where_example_runs_across_every_study(sqlite_ledger):
    ledger = Ledger(sqlite_ledger)
    example = next(line for line in readme_blocks("bash")[0].splitlines() if "--where" in line)
    args = shlex.split(example)
    assert args[:2] == ["studyrunner", "results"] and args[2] == "--where"  # no study named: every study
    result = runner.invoke(app, [*args[1:], "--format", "csv", "--db", sqlite_ledger])
    assert result.exit_code == 0, result.output
    keys = csv_keys(result.stdout)
    assert keys == expected_keys(
        ledger, lambda c, m, seed: c["model.params.loops"] >= 4 and m.get("eval_accuracy", 0) > 0.6
    )
    assert {k.split("-")[0] for k in keys} == {"alpha", "beta"}  # both studies answer


def digits(c: dict) -> int | None:
    return c.get("task.params.digits")  # alpha has none: a rule naming digits never matches alpha


@pytest.mark.parametrize(
    "where,keep",
    [
        (
            "model.params.loops >= 4 and eval_accuracy > 0.6",
            lambda c, m, seed: c["model.params.loops"] >= 4 and m.get("eval_accuracy", 0) > 0.6,
        ),
        ("params.loops == 2", lambda c, m, seed: c["model.params.loops"] == 2),
        ("digits == 2 or seed == 1", lambda c, m, seed: digits(c) is not None and (digits(c) == 2 or seed == 1)),
        ("halt_collapsed", lambda c, m, seed: m.get("halt_collapsed") is True),
        ("not task.params.digits >= 3", lambda c, m, seed: digits(c) == 2),
        (
            "eval_accuracy > 0.5 and not (loops < 4)",
            lambda c, m, seed: m.get("eval_accuracy", 0) > 0.5 and c["model.params.loops"] >= 4,
        ),
    ],
)
def test_where_selects_across_two_studies(sqlite_ledger, where, keep):
    result = cli("alpha", "beta", "--where", where, "--format", "csv", "--db", sqlite_ledger)
    assert result.exit_code == 0, result.output
    expected = expected_keys(Ledger(sqlite_ledger), keep)
    assert expected  # each case selects something
    assert csv_keys(result.stdout) == expected


def test_where_python_api_matches_the_cli(sqlite_ledger):
    df = results.load_many(["alpha", "beta"], where="loops >= 4", db=sqlite_ledger)
    cli_keys = csv_keys(cli("--where", "loops >= 4", "--format", "csv", "--db", sqlite_ledger).stdout)
    assert set(df.trial_key) == cli_keys and set(df.study) == {"alpha", "beta"}
    assert (df["model.params.loops"] >= 4).all()
    everything = results.load_many(db=sqlite_ledger)
    assert len(everything) == 8 + 4 and list(everything.study) == ["alpha"] * 8 + ["beta"] * 4
    assert list(everything.columns[: len(results.ID_COLUMNS)]) == results.ID_COLUMNS
    assert {"task.params.digits", "task.params.hops", "eval.loops"} <= set(everything.columns)
    assert everything.loc[everything.study == "alpha", "task.params.digits"].isna().all()


@pytest.mark.parametrize(
    "where,fragments",
    [
        ("loops >= ", ["--where: position 10", "expected a number"]),
        ("loops >> 4", ["--where: position 8"]),
        ("eval_accuracy > 0.5 extra.thing", ["position 21", "'extra.thing'"]),
        ("(loops > 1", ["--where: position 11", "')'"]),
        ("loops + 1 > 2", ["--where: position 7", "arithmetic"]),
        ("loop > 1", ["--where: no column 'loop'", "model.params.loops"]),
        ("eval_acuracy > 0.5", ["no column 'eval_acuracy'", "did you mean: eval_accuracy"]),
        ("status > 0", ["--where: 'status' holds no numbers"]),
        ("cell > 0", ["'cell' holds no numbers"]),
        ("started_at > 0", ["'started_at' holds no numbers"]),
    ],
)
def test_bad_where_is_one_line_naming_where(sqlite_ledger, where, fragments):
    result = cli("--where", where, "--db", sqlite_ledger)
    assert result.exit_code == 2  # a value that cannot be read: a usage error, as click's own
    assert "Traceback" not in result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    for fragment in fragments:
        assert fragment in message


def test_an_ambiguous_name_lists_the_candidates(sqlite_ledger):
    ledger = Ledger(sqlite_ledger)
    with ledger.session() as s, s.begin():  # a cell no study file makes: two numeric `depth` fields
        s.add(StudyRow(name="gamma", spec_text="", spec_hash=""))
        s.flush()
        s.add(
            CellRow(
                study="gamma", cell_hash="c0", label="x", config={"a": {"depth": 1}, "b": {"depth": 2}}, overrides={}
            )
        )
        s.flush()
        s.add(TrialRow(trial_key="gamma-c0-s0", study="gamma", cell_hash="c0", seed=0, metrics={"eval_accuracy": 1.0}))
    result = cli("--where", "depth > 0", "--db", sqlite_ledger)
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --where: 'depth' is ambiguous; write one of: a.depth, b.depth"
    ok = cli("--where", "b.depth > 1", "--format", "csv", "--db", sqlite_ledger)
    assert ok.exit_code == 0 and csv_keys(ok.stdout) == {"gamma-c0-s0"}
    with pytest.raises(StudyrunnerError, match="^where: 'depth' is ambiguous"):
        results.load_many(where="depth > 0", db=sqlite_ledger)


def test_results_of_one_study_keep_their_formats(sqlite_ledger, tmp_path):
    ledger = Ledger(sqlite_ledger)
    csv = cli("alpha", "--format", "csv", "--db", sqlite_ledger)
    assert csv.exit_code == 0
    frame = results.trials_frame(ledger, "alpha")
    assert list(pd.read_csv(StringIO(csv.stdout)).columns) == list(frame.columns)
    assert "task.params.digits" not in frame.columns  # one study: only its own columns
    rows = json.loads(cli("alpha", "--format", "json", "--db", sqlite_ledger).stdout)
    assert len(rows) == len(frame) == 8
    out = tmp_path / "r.parquet"
    parquet = cli("alpha", "beta", "--format", "parquet", "--out", str(out), "--db", sqlite_ledger)
    assert parquet.exit_code == 0 and len(pd.read_parquet(out)) == 12
    table = cli("alpha", "--db", sqlite_ledger).stdout
    assert "eval_accuracy" in table and "succeeded" in table and "beta" not in table
    both = cli("--where", "loops >= 4", "--db", sqlite_ledger).stdout
    assert "alpha" in both and "beta" in both  # several studies: a study column
    missing = cli("alpha", "nope", "--db", sqlite_ledger)
    assert missing.exit_code == 1 and "no study named 'nope'" in missing.stderr


# --- migration 0003 backfills the long tables ----------------------------------------------------------


@pytest.mark.e2e
def test_upgrading_a_0002_ledger_backfills_the_long_tables(url):
    from alembic import command

    from studyrunner.store import schema_versions as schema

    config = {
        "model": {"family": "looped", "params": {"loops": 4, "bias": False, "dropout": 0.0}},
        "train": {"betas": [0.9, 0.98]},
        "extra": {},
    }
    metrics = {"eval_accuracy": 0.75, "halt_collapsed": True, "steps": 100, "note": "x", "curve": [1, 2]}
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(schema._config(conn), "0002")
        conn.execute(
            text("INSERT INTO studies VALUES ('old', '', 'name: old', 'h', NULL, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)")
        )
        conn.execute(
            text("INSERT INTO cells VALUES ('old', 'c0', 'base', :config, '{}', NULL, NULL)"),
            {"config": json.dumps(config)},
        )
        for seed, trial_metrics in ((0, json.dumps(metrics)), (1, None), (2, "null")):
            conn.execute(
                text(
                    "INSERT INTO trials VALUES (:key, 'old', 'c0', :seed, 'succeeded', 1, CURRENT_TIMESTAMP, "
                    "NULL, NULL, NULL, :metrics, NULL)"
                ),
                {"key": f"old-c0-s{seed}", "seed": seed, "metrics": trial_metrics},
            )
    assert schema.upgrade(engine) == ("0002", schema.head())
    engine.dispose()
    ledger = Ledger(url)
    assert long_metrics(ledger) == {
        "old-c0-s0": {"eval_accuracy": 0.75, "halt_collapsed": 1.0, "steps": 100.0},
    }
    assert long_params(ledger) == {("old", "c0"): expected_params(config)}
    # the migration's copy of the rules agrees with the module the ledger writes through
    assert long_params(ledger)[("old", "c0")] == longform.param_values(config)
    assert long_metrics(ledger)["old-c0-s0"] == longform.metric_values(metrics)
