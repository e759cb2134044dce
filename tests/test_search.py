"""Optuna searches (`search:`): the block's rules at validate, and searches run on a real Ray with real Optuna
storage (SQLite beside the ledger, a schema of a real PostgreSQL), tiny models, a driver killed mid-search."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import TINY_STUDY
from mlflow import MlflowClient
from test_ledger import postgres_url  # noqa: F401 - the throwaway PostgreSQL server fixture

from studyrunner.analysis import data as analysis_data
from studyrunner.analysis.summary import analyze
from studyrunner.errors import SpecError
from studyrunner.orchestrate import RerunSelection, RunOptions, rerun, resume, submit
from studyrunner.orchestrate.feeds.search_optuna import seeded_sampler
from studyrunner.orchestrate.feeds.search_storage import OPTUNA_SCHEMA, open_storage, optuna_location
from studyrunner.store import Ledger
from studyrunner.study import compile_study, loads
from studyrunner.study.compiler import search_cell
from studyrunner.workspace import Workspace

EXE = [sys.executable, "-m", "studyrunner.cli"]
SPACE = """\
search:
  algorithm: optuna
  sampler: {sampler}
  n_trials: {n_trials}
  seed: 3
  space:
    train.lr: {{loguniform: [1.0e-4, 1.0e-2]}}
    model.params.loops: {{int: [1, 3]}}
"""


def search_text(
    name: str, n_trials: int = 3, sampler: str = "tpe", grid: bool = False, steps: int = 12, seeds: str = "[0, 1]"
) -> str:
    """TINY_STUDY searching the learning rate and the loop count; `grid`: its grid over loops [1, 2] kept, and
    the learning rate searched in each grid cell."""
    text = TINY_STUDY.replace("name: tiny", f"name: {name}").replace("steps: 12", f"steps: {steps}")
    text = text.replace("seeds: [0, 1]", f"seeds: {seeds}") + SPACE.format(sampler=sampler, n_trials=n_trials)
    if grid:
        return text.replace("    model.params.loops: {int: [1, 3]}\n", "")
    return text.replace("grid:\n  model.params.loops: [1, 2]\n", "")


# ------------------------------------------------------------------------------- the block, at validate


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        (
            "{loguniform: [1.0e-4, 1.0e-2]}",
            "{loguniform: [0, 1.0e-2]}",
            r"search.space\['train.lr'\]: loguniform needs 0 < low",
        ),
        (
            "{loguniform: [1.0e-4, 1.0e-2]}",
            "{uniform: [0.2, 0.1]}",
            r"search.space\['train.lr'\]: low \(0.2\) must be below",
        ),
        (
            "{loguniform: [1.0e-4, 1.0e-2]}",
            "{loguniform: [1.0e-4, 2.0]}",
            r"loguniform value 2.0 is refused: .*less than or equal to 1",
        ),
        (
            "{int: [1, 3]}",
            "{uniform: [1, 3]}",
            r"search.space\['model.params.loops'\]: uniform value .* an integer path takes \{int",
        ),
        ("{int: [1, 3]}", "{int: [1, 2.5]}", r"int takes two integers"),
        ("{int: [1, 3]}", "{choice: [2]}", r"choice needs at least two values"),
        ("{int: [1, 3]}", "{range: [1, 3]}", r"give one of \{loguniform"),
        (
            "model.params.loops:",
            "model.params.lops:",
            r"search.space\['model.params.lops'\]: int value 1 is refused: unknown key",
        ),
        ("model.params.loops:", "loops:", r"search.space.loops: path 'loops' is not a dotted path"),
        ("n_trials: 3", "n_trials: 0", r"search.n_trials: Input should be greater than or equal to 1"),
        ("sampler: tpe", "sampler: cma", r"search.sampler: Input should be 'tpe', 'gp', 'cmaes' or 'random'"),
        ("algorithm: optuna", "algorithm: hyperopt", r"search.algorithm: Input should be 'optuna'"),
        ("seed: 3", "seeds: 3", r"search.seeds: unknown key; valid keys: algorithm, max_concurrent"),
    ],
)
def test_a_bad_search_block_is_one_line_naming_the_field(old, new, says):
    with pytest.raises(SpecError, match=says) as caught:
        compile_study(loads(search_text("bad").replace(old, new)))
    assert "\n" not in str(caught.value)


def test_a_path_also_in_the_grid_and_cmaes_with_a_choice_are_refused():
    with pytest.raises(SpecError, match=r"search.space\['model.params.loops'\]: path is also varied in grid"):
        loads(
            search_text("twice", grid=True).replace(
                "    train.lr:", "    model.params.loops: {int: [1, 3]}\n    train.lr:"
            )
        )
    choice = search_text("cma", sampler="cmaes").replace("{int: [1, 3]}", "{choice: [1, 3]}")
    with pytest.raises(SpecError, match=r"search.sampler: cmaes samples numeric ranges only, and model.params.loops"):
        loads(choice)
    assert compile_study(loads(choice.replace("cmaes", "gp")))  # gp takes a choice
    with pytest.raises(SpecError, match=r"baselines: matched baselines belong to grids"):
        loads(search_text("based") + "baselines: [iso_flop]\n")


def test_validate_and_plan_describe_a_search(write_study):
    from typer.testing import CliRunner

    from studyrunner.cli import app

    path = write_study(search_text("described", grid=True))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "search: optuna tpe, 3 configurations x 2 seeds in each of 2 grid cells = up to 12 trials" in result.output
    planned = CliRunner().invoke(app, ["plan", str(path)])
    assert planned.exit_code == 0 and "loops=2" in planned.output and "loguniform [0.0001, 0.01]" in planned.output
    bad = CliRunner().invoke(
        app, ["validate", str(write_study(search_text("x").replace("n_trials: 3", "n_trials: -1")))]
    )
    assert bad.exit_code == 2 and "search.n_trials" in bad.output


def test_the_json_schema_describes_ranges_as_they_are_written():
    import jsonschema
    import yaml

    from studyrunner.study.jsonschema import study_json_schema

    schema = study_json_schema()
    shipped = yaml.safe_load((Path(__file__).parents[1] / "studies" / "quickstart_lr_search.yaml").read_text())
    jsonschema.validate(shipped, schema)
    shipped["search"]["space"]["train.lr"] = {"loguniform": [1.0e-4]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(shipped, schema)


def test_a_search_compiles_to_its_grid_cells_and_a_suggestion_hashes_as_a_grid_value_would():
    compiled = compile_study(loads(search_text("hashes", grid=True)))
    assert compiled.cells == [] and compiled.trials == []
    assert [b.label for b in compiled.bases] == ["loops=1", "loops=2"]
    cell = search_cell(compiled.study, compiled.bases[1], {"train.lr": 2.0e-3})
    grid = compile_study(loads(TINY_STUDY.replace("lr: 1.0e-3", "lr: 2.0e-3")))
    assert cell.cell_hash == next(c.cell_hash for c in grid.cells if c.overrides == {"model.params.loops": 2})
    assert cell.overrides == {"model.params.loops": 2, "train.lr": 2.0e-3} and cell.label == "loops=2 lr=0.002"
    # A study without `search:` compiles as it always did: the field stays out of every cell.
    plain = compile_study(loads(TINY_STUDY))
    assert all("search" not in c.config for c in plain.cells) and plain.bases == []


def test_the_optuna_study_lives_beside_the_ledger_not_in_its_tables():
    assert optuna_location("sqlite:////data/ws/ledger.db") == ("sqlite:////data/ws/ledger.optuna.db", {})
    url, kwargs = optuna_location("postgresql+psycopg://u@h/db")
    assert url == "postgresql+psycopg://u@h/db" and f"search_path={OPTUNA_SCHEMA}" in kwargs["connect_args"]["options"]
    from studyrunner.errors import StudyrunnerError

    with pytest.raises(StudyrunnerError, match="SQLite or PostgreSQL"):
        optuna_location("mysql://u@h/db")


@pytest.mark.parametrize("sampler", ["tpe", "gp", "cmaes", "random"])
def test_suggestion_n_depends_on_the_history_and_n_not_on_the_process_that_asks(sampler):
    """What makes a search continued after a crash suggest what the uninterrupted one would have."""
    from optuna.distributions import FloatDistribution, IntDistribution

    space = {"x": FloatDistribution(1e-3, 1.0, log=True), "k": IntDistribution(1, 8)}
    score = lambda p: -((p["x"] - 0.1) ** 2) - 0.01 * abs(p["k"] - 3)  # noqa: E731
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    uninterrupted = optuna.create_study(sampler=seeded_sampler(sampler, 5), direction="maximize")
    for _ in range(13):  # past the samplers' random start-up (10 for tpe and gp)
        trial = uninterrupted.ask(space)
        uninterrupted.tell(trial, score(trial.params))
    resumed = optuna.create_study(sampler=seeded_sampler(sampler, 5), direction="maximize")
    for t in uninterrupted.trials[:12]:  # a new process finds the first 12 in storage
        resumed.add_trial(t)
    assert resumed.ask(space).params == uninterrupted.trials[12].params
    other = optuna.create_study(sampler=seeded_sampler(sampler, 6), direction="maximize")
    assert other.ask(space).params != uninterrupted.trials[0].params  # the seed matters


# ----------------------------------------------------------------------------- searches on a real Ray


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def optuna_trials(db_url: str, name: str) -> list:
    return optuna.load_study(study_name=name, storage=open_storage(db_url)).get_trials(deepcopy=False)


@pytest.mark.e2e
def test_a_search_runs_each_configuration_once_per_seed_and_continues_to_n_trials(ray_session, tmp_path, monkeypatch):
    ws = Workspace.resolve(tmp_path)
    monkeypatch.setenv("STUDYRUNNER_INJECT_FAULT", "tuned-*-s1")  # every seed 1 fails (a code error)
    result = submit(compile_study(loads(search_text("tuned"))), ws, show_progress=False)
    ledger = Ledger(ws.db_url)
    points = ledger.search_points("tuned")
    assert [p.number for p in points] == [0, 1, 2] and {p.state for p in points} == {"complete"}
    rows = {r.trial_key: r for r in ledger.trials("tuned")}
    assert len(rows) == 6 and len(result.succeeded) == 3 and len(result.failed) == 3
    for p in points:  # each configuration: an ordinary trial per seed, keyed by its cell's hash
        cell = next(c for c in ledger.cells("tuned") if c.cell_hash == p.cell_hash)
        assert cell.config["train"]["lr"] == p.params["train.lr"]
        assert cell.config["model"]["params"]["loops"] == p.params["model.params.loops"]
        seed0, seed1 = rows[f"tuned-{p.cell_hash}-s0"], rows[f"tuned-{p.cell_hash}-s1"]
        assert seed0.status == "succeeded" and seed1.status == "failed"
        assert p.value == seed0.metrics["eval_accuracy"] and p.seeds == 1  # a failed seed is left out of the mean
    told = optuna_trials(ws.db_url, "tuned")
    assert [(t.number, t.state, t.value) for t in told] == [
        (p.number, optuna.trial.TrialState.COMPLETE, p.value) for p in points
    ]
    assert [t.params for t in told] == [p.params for p in points]
    assert told[0].user_attrs["cell_hash"] == points[0].cell_hash and told[0].user_attrs["seeds"] == 1
    # The Optuna study has its own file beside the ledger; neither holds the other's tables.
    assert "trial_params" in tables(tmp_path / "ledger.optuna.db") and "cells" not in tables(
        tmp_path / "ledger.optuna.db"
    )
    assert "search_points" in tables(tmp_path / "ledger.db") and "trial_params" not in tables(tmp_path / "ledger.db")
    # MLflow: a parent run per configuration, a run per (configuration, seed).
    client = MlflowClient(ws.tracking_uri)
    experiment = client.get_experiment_by_name("tuned").experiment_id
    assert len(client.search_runs([experiment], "tags.kind = 'cell'")) == 3
    assert len(client.search_runs([experiment], "tags.kind = 'trial'")) == 6

    monkeypatch.delenv("STUDYRUNNER_INJECT_FAULT")
    from studyrunner.errors import StudyrunnerError

    with pytest.raises(StudyrunnerError, match=r"changes cells .* that already ran \(train.steps\)"):
        submit(compile_study(loads(search_text("tuned", steps=16))), ws, show_progress=False)
    again = submit(compile_study(loads(search_text("tuned"))), ws, show_progress=False)
    assert again.ran == 0 and len(ledger.search_points("tuned")) == 3  # finished: nothing runs, nothing is asked
    assert resume("tuned", ws, options=RunOptions(show_progress=False)).ran == 0
    more = submit(compile_study(loads(search_text("tuned", n_trials=4))), ws, show_progress=False)
    assert more.ran == 2 and [p.number for p in ledger.search_points("tuned")] == [0, 1, 2, 3]
    assert len(optuna_trials(ws.db_url, "tuned")) == 4

    # rerun and analyze work on a search's trials as on a grid's
    failed = [k for k, r in rows.items() if r.status == "failed"][:1]
    cell = failed[0].split("-")[1]
    rerun("tuned", ws, RerunSelection(failed=True, seeds=(1,), cells=(cell,)), options=RunOptions(show_progress=False))
    assert Ledger(ws.db_url).trials("tuned", failed)[0].status == "succeeded"
    data = analysis_data.load("tuned", workspace=tmp_path)
    history = analyze(data).search
    assert list(history.number) == [0, 1, 2, 3] and history.best.sum() == 1
    best = history[history.best].iloc[0]
    assert best.value == history.value.max() and list(history.best_so_far) == list(history.value.cummax())
    assert analyze(data).to_dict()["search_best"][0]["cell_hash"] == best.cell_hash


@pytest.mark.e2e
def test_the_ledger_and_optuna_are_reconciled_after_a_driver_died_between_their_writes(ray_session, tmp_path):
    from optuna.distributions import FloatDistribution, IntDistribution
    from sqlalchemy import create_engine, text

    ws = Workspace.resolve(tmp_path)
    compiled = compile_study(loads(search_text("orphan", n_trials=2, sampler="random", seeds="[0]")))
    # Optuna was asked for a configuration, and the driver died before the ledger heard of it.
    study = optuna.create_study(study_name="orphan", storage=open_storage(ws.db_url), direction="maximize")
    asked = study.ask(
        {"train.lr": FloatDistribution(1e-4, 1e-2, log=True), "model.params.loops": IntDistribution(1, 3)}
    )
    assert submit(compiled, ws, show_progress=False).ran == 2
    ledger = Ledger(ws.db_url)
    points = ledger.search_points("orphan")
    assert [(p.number, p.state) for p in points] == [(0, "complete"), (1, "complete")]
    assert points[0].params == asked.params  # recorded and run, not asked again
    # Optuna was told, and the driver died before the ledger recorded it.
    engine = create_engine(ws.db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE search_points SET state = 'running', value = NULL WHERE number = 1"))
    engine.dispose()
    assert submit(compiled, ws, show_progress=False).ran == 0
    told = optuna_trials(ws.db_url, "orphan")
    assert [(p.state, p.value) for p in ledger.search_points("orphan")] == [("complete", t.value) for t in told]
    # The Optuna study deleted: the ledger has every suggestion and outcome, and rebuilds it.
    (tmp_path / "ledger.optuna.db").unlink()
    assert (
        submit(
            compile_study(loads(search_text("orphan", n_trials=3, sampler="random", seeds="[0]"))),
            ws,
            show_progress=False,
        ).ran
        == 1
    )
    rebuilt = optuna_trials(ws.db_url, "orphan")
    assert [(t.params, t.value) for t in rebuilt[:2]] == [(t.params, t.value) for t in told] and len(rebuilt) == 3


@pytest.mark.e2e
def test_a_configuration_no_seed_finishes_is_failed_in_optuna(ray_session, tmp_path, monkeypatch):
    ws = Workspace.resolve(tmp_path)
    monkeypatch.setenv("STUDYRUNNER_INJECT_FAULT", "broken-*")
    submit(compile_study(loads(search_text("broken", n_trials=2, sampler="random"))), ws, show_progress=False)
    points = Ledger(ws.db_url).search_points("broken")
    assert [(p.state, p.value, p.seeds) for p in points] == [("failed", None, 0)] * 2
    assert {t.state for t in optuna_trials(ws.db_url, "broken")} == {optuna.trial.TrialState.FAIL}


@pytest.mark.e2e
def test_a_repeated_suggestion_is_told_from_the_ledger_without_running_again(ray_session, tmp_path):
    text = search_text("repeats", n_trials=4, sampler="random", seeds="[0]")
    text = text.replace("{loguniform: [1.0e-4, 1.0e-2]}", "{choice: [1.0e-3, 2.0e-3]}").replace(
        "{int: [1, 3]}", "{int: [1, 1]}"
    )
    ws = Workspace.resolve(tmp_path)
    with pytest.raises(SpecError, match=r"low \(1\) must be below high"):
        loads(text)
    text = text.replace("    model.params.loops: {int: [1, 1]}\n", "")
    result = submit(compile_study(loads(text)), ws, show_progress=False)
    points = Ledger(ws.db_url).search_points("repeats")
    cells = {p.cell_hash for p in points}
    assert len(points) == 4 and len(cells) == 2 and result.ran == 2  # four suggestions, two configurations
    for cell in cells:
        assert len({p.value for p in points if p.cell_hash == cell}) == 1
    assert all(Ledger(ws.db_url).trials("repeats")[i].attempts == 1 for i in range(2))


@pytest.mark.e2e
def test_a_search_runs_from_one_submit_at_a_time(tmp_path):
    """A submit finding the search held by a live submit says so in one line, runs nothing and writes nothing
    of the search (tests/test_search_race.py races two real submits)."""
    from io import StringIO

    from rich.console import Console

    ws = Workspace.resolve(tmp_path)
    ledger = Ledger(ws.db_url)
    compiled = compile_study(loads(search_text("alone")))
    ledger.ensure_study(compiled.study)
    holder = ledger.open_submission("alone", "submit")  # a live submit (this process) runs the search
    assert ledger.claim_owner("alone", holder) is None
    out = StringIO()
    result = submit(compiled, ws, show_progress=False, console=Console(file=out, width=200))
    assert result.study_busy and result.ran == 0
    (line,) = [x for x in out.getvalue().splitlines() if x.strip()]
    assert "another submit runs this search (submit pid" in line and "studyrunner cancel alone" in line
    assert ledger.search_points("alone") == [] and not (tmp_path / "ledger.optuna.db").exists()
    assert ledger.get_study("alone").owner == holder
    assert [s.ended_at is not None for s in ledger._open_submissions("alone")] == [False]  # the loser's ended


@pytest.mark.e2e
def test_a_space_optuna_cannot_continue_is_refused_before_anything_is_written(ray_session, tmp_path):
    """A space edit Optuna cannot continue (`{int}` changed to `{choice}`) is refused before anything is written:
    failing half way through asking Optuna would leave a trial with only `train.lr`, which the next submit would
    run with `loops` at its base value."""
    from studyrunner.errors import StudyrunnerError

    ws = Workspace.resolve(tmp_path)
    text = search_text("kinds", n_trials=2, sampler="random", seeds="[0]")
    assert submit(compile_study(loads(text)), ws, show_progress=False).ran == 2
    ledger = Ledger(ws.db_url)

    def stored() -> tuple:
        points = [(p.number, p.state, p.params) for p in ledger.search_points("kinds")]
        told = [(t.number, t.state, t.params) for t in optuna_trials(ws.db_url, "kinds")]
        return ledger.get_study("kinds").spec_text, points, told, len(ledger.trials("kinds"))

    before = stored()
    more = text.replace("n_trials: 2", "n_trials: 3")
    for old, new, says in [
        ("{int: [1, 3]}", "{choice: [1, 3]}", r"\{choice: \[1, 3\]\} but .* drew it from \{int: \[1, 3\]\}"),
        ("{int: [1, 3]}", "{choice: [1, 2, 3]}", r"\{choice: \[1, 2, 3\]\} but"),
        ("{loguniform: [1.0e-4, 1.0e-2]}", "{uniform: [1.0e-4, 1.0e-2]}", r"\{uniform: .* from \{loguniform: "),
    ]:
        path = "model.params.loops" if "int" in old else "train.lr"
        with pytest.raises(StudyrunnerError, match=rf"search.space\['{path}'\] is {says}.*--as-new-study NAME") as e:
            submit(compile_study(loads(more.replace(old, new))), ws, show_progress=False)
        assert "\n" not in str(e.value)
        assert stored() == before and ledger.get_study("kinds").owner is None
    # A wider range continues the search; every suggestion has every searched value.
    assert submit(compile_study(loads(more.replace("{int: [1, 3]}", "{int: [1, 4]}"))), ws, show_progress=False).ran
    told = optuna_trials(ws.db_url, "kinds")
    assert [t.state for t in told] == [optuna.trial.TrialState.COMPLETE] * 3
    assert all(set(t.params) == {"train.lr", "model.params.loops"} for t in told)


@pytest.mark.e2e
def test_a_suggestion_optuna_began_without_every_value_is_failed_and_never_run(ray_session, tmp_path):
    """What a submit that failed half way through asking Optuna leaves behind: trial #2 running with `train.lr`
    only. The next submit must not run it with `loops` at its base value: it is told FAIL, recorded `abandoned`, and not
    counted in n_trials."""
    from optuna.distributions import FloatDistribution

    ws = Workspace.resolve(tmp_path)
    text = search_text("halfasked", n_trials=2, sampler="random", seeds="[0]")
    assert submit(compile_study(loads(text)), ws, show_progress=False).ran == 2
    study = optuna.load_study(study_name="halfasked", storage=open_storage(ws.db_url))
    assert study.ask({"train.lr": FloatDistribution(1e-4, 1e-2, log=True)}).number == 2
    more = compile_study(loads(text.replace("n_trials: 2", "n_trials: 3")))
    assert submit(more, ws, show_progress=False).ran == 1
    ledger = Ledger(ws.db_url)
    points = ledger.search_points("halfasked")
    assert [(p.number, p.state) for p in points] == [
        (0, "complete"),
        (1, "complete"),
        (2, "abandoned"),
        (3, "complete"),
    ]
    assert points[2].cell_hash is None and "without model.params.loops" in points[2].error
    told = optuna_trials(ws.db_url, "halfasked")
    assert [t.state.name for t in told] == ["COMPLETE", "COMPLETE", "FAIL", "COMPLETE"]
    cells = {c.cell_hash: c.config for c in ledger.cells("halfasked")}
    assert len(cells) == 3 and len(ledger.trials("halfasked")) == 3
    for p in points:  # every configuration that ran had every searched value
        if p.cell_hash is not None:
            assert cells[p.cell_hash]["model"]["params"]["loops"] == p.params["model.params.loops"]
    assert submit(more, ws, show_progress=False).ran == 0  # the search is finished: 3 configurations


@pytest.mark.e2e
def test_a_suggestion_that_fails_half_way_is_told_failed_and_the_next_submit_continues(
    ray_session, tmp_path, monkeypatch
):
    """Any failure while Optuna makes a suggestion (here its storage, after the first value) leaves no trial
    running in Optuna: it is told FAIL, the submit ends with one line, and the next one asks again."""
    from optuna.storages._cached_storage import _CachedStorage

    from studyrunner.errors import StudyrunnerError

    real = _CachedStorage.set_trial_param

    def fails_on_loops(self, trial_id, name, value, distribution):
        if name == "model.params.loops":
            raise RuntimeError("the database went away")
        return real(self, trial_id, name, value, distribution)

    ws = Workspace.resolve(tmp_path)
    compiled = compile_study(loads(search_text("midask", n_trials=2, sampler="random", seeds="[0]")))
    monkeypatch.setattr(_CachedStorage, "set_trial_param", fails_on_loops)
    with pytest.raises(StudyrunnerError, match=r"Optuna could not make a suggestion \(RuntimeError: the database went"):
        submit(compiled, ws, show_progress=False)
    monkeypatch.undo()
    (told,) = optuna_trials(ws.db_url, "midask")
    assert told.state is optuna.trial.TrialState.FAIL and set(told.params) == {"train.lr"}
    ledger = Ledger(ws.db_url)
    assert [(p.number, p.state) for p in ledger.search_points("midask")] == [(0, "abandoned")]
    assert ledger.get_study("midask").owner is None and ledger.trials("midask") == []
    assert submit(compiled, ws, show_progress=False).ran == 2
    assert [p.state for p in ledger.search_points("midask")] == ["abandoned", "complete", "complete"]


@pytest.mark.e2e
def test_a_searchs_values_follow_reruns_and_added_seeds(ray_session, tmp_path, monkeypatch):
    """After `rerun --failed` turns a search's failed configurations into successes, `analyze` gives a best and
    the history says complete; an added seed moves the values to the means over both seeds. Optuna trials cannot
    change once told: the values come from the ledger's trials, what Optuna was told beside them."""
    from io import StringIO

    from rich.console import Console

    ws = Workspace.resolve(tmp_path)
    monkeypatch.setenv("STUDYRUNNER_INJECT_FAULT", "stale-*")  # every configuration fails
    submit(
        compile_study(loads(search_text("stale", n_trials=2, sampler="random", seeds="[0]"))), ws, show_progress=False
    )
    monkeypatch.delenv("STUDYRUNNER_INJECT_FAULT")
    out = analyze(analysis_data.load("stale", workspace=tmp_path)).to_dict()
    assert out["search_best"] == [] and [h["state"] for h in out["search"]] == ["failed", "failed"]

    rerun("stale", ws, RerunSelection(failed=True), options=RunOptions(show_progress=False))
    rows = {r.trial_key: r for r in Ledger(ws.db_url).trials("stale")}
    assert {r.status for r in rows.values()} == {"succeeded"}
    out = analyze(analysis_data.load("stale", workspace=tmp_path)).to_dict()
    history = out["search"]
    assert [h["state"] for h in history] == ["complete"] * 2
    for h in history:
        assert h["value"] == rows[f"stale-{h['cell_hash']}-s0"].metrics["eval_accuracy"] and h["seeds"] == 1
    (best,) = out["search_best"]
    assert best["value"] == max(h["value"] for h in history)
    assert [(h["told_state"], h["told_value"]) for h in history] == [("failed", None)] * 2  # what Optuna has

    console = StringIO()
    two = compile_study(loads(search_text("stale", n_trials=2, sampler="random", seeds="[0, 1]")))
    assert submit(two, ws, show_progress=False, console=Console(file=console, width=300)).ran == 2  # seed 1
    rows = {r.trial_key: r for r in Ledger(ws.db_url).trials("stale")}
    history = analyze(analysis_data.load("stale", workspace=tmp_path)).to_dict()["search"]
    for h in history:
        seeds = [rows[f"stale-{h['cell_hash']}-s{s}"].metrics["eval_accuracy"] for s in (0, 1)]
        assert h["seeds"] == 2 and h["value"] == pytest.approx(sum(seeds) / 2)
    best = max(history, key=lambda h: h["value"])
    assert f"best eval_accuracy {best['value']:.4g} over 2 seeds (#{best['number']}" in console.getvalue()


@pytest.mark.e2e
def test_values_that_do_not_fit_together_are_failed_without_a_trial(ray_session, tmp_path):
    text = search_text("misfit", n_trials=2, sampler="random", seeds="[0]")
    text = text.replace("    train.lr: {loguniform: [1.0e-4, 1.0e-2]}\n    model.params.loops: {int: [1, 3]}\n", "")
    text += "    model.params.d_model: {choice: [18, 22]}\n    model.params.n_heads: {choice: [4, 8]}\n"
    ws = Workspace.resolve(tmp_path)
    result = submit(compile_study(loads(text)), ws, show_progress=False)  # each alone fits; no pair does
    points = Ledger(ws.db_url).search_points("misfit")
    assert result.ran == 0 and [(p.state, p.cell_hash) for p in points] == [("failed", None)] * 2
    assert all("must be divisible by n_heads" in p.error for p in points)
    assert {t.state for t in optuna_trials(ws.db_url, "misfit")} == {optuna.trial.TrialState.FAIL}


@pytest.mark.e2e
def test_a_grid_with_a_search_runs_one_search_per_grid_cell(ray_session, tmp_path):
    ws = Workspace.resolve(tmp_path)
    compiled = compile_study(loads(search_text("perdepth", n_trials=2, grid=True, seeds="[0]")))
    result = submit(compiled, ws, show_progress=False)
    assert len(result.succeeded) == 4
    points = Ledger(ws.db_url).search_points("perdepth")
    names = {b.label: f"perdepth.{b.cell_hash}" for b in compiled.bases}
    assert sorted({p.search for p in points}) == sorted(names.values())
    cells = {c.cell_hash: c for c in Ledger(ws.db_url).cells("perdepth")}
    for label, name in names.items():
        mine = [p for p in points if p.search == name]
        assert [p.number for p in mine] == [0, 1]
        loops = int(label.split("=")[1])
        assert all(cells[p.cell_hash].config["model"]["params"]["loops"] == loops for p in mine)
        assert len(optuna_trials(ws.db_url, name)) == 2


@pytest.mark.e2e
def test_a_search_on_postgresql_keeps_optuna_in_its_own_schema(ray_session, tmp_path, postgres_url):  # noqa: F811
    from sqlalchemy import create_engine, inspect

    ws = Workspace.resolve(tmp_path, db=postgres_url)
    text = search_text("pgsearch", n_trials=2, sampler="random", seeds="[0]").replace(
        "seed: 3", "seed: 3\n  max_concurrent: 2"
    )
    assert len(submit(compile_study(loads(text)), ws, show_progress=False).succeeded) == 2
    engine = create_engine(postgres_url)
    try:
        ledger_tables = set(inspect(engine).get_table_names())
        optuna_tables = set(inspect(engine).get_table_names(schema=OPTUNA_SCHEMA))
    finally:
        engine.dispose()
    assert {"studies", "trials", "search_points"} <= ledger_tables and "trial_params" not in ledger_tables
    assert {"studies", "trials", "trial_params", "alembic_version"} <= optuna_tables
    told = optuna_trials(postgres_url, "pgsearch")
    points = Ledger(postgres_url).search_points("pgsearch")
    assert [(t.number, t.value) for t in told] == [(p.number, p.value) for p in points] and len(points) == 2
    assert submit(compile_study(loads(text)), ws, show_progress=False).ran == 0


# ------------------------------------------------------------------------- a driver killed mid-search


def statuses(db: Path) -> tuple[dict[str, str], list[str]]:
    if not db.exists():
        return {}, []
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        trials = dict(conn.execute("SELECT trial_key, status FROM trials"))
        states = [r[0] for r in conn.execute("SELECT state FROM search_points")]
        conn.close()
        return trials, states
    except sqlite3.Error:  # the ledger is still being created by the process under test
        return {}, []


@pytest.mark.e2e
@pytest.mark.faults
def test_a_search_whose_driver_is_killed_continues_without_running_finished_configurations(tmp_path):
    study = tmp_path / "crashy.yaml"
    study.write_text(search_text("crashy", n_trials=3, steps=80))
    ws = tmp_path / "ws"
    env = {**os.environ, "STUDYRUNNER_HOME": str(ws)}
    for name in ("MLFLOW_TRACKING_URI", "STUDYRUNNER_DB", "STUDYRUNNER_STORAGE"):
        env.pop(name, None)
    driver = subprocess.Popen(
        [*EXE, "submit", str(study), "--no-progress"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 300
    while True:  # a configuration told, another one's seeds running: kill the driver there
        trials, states = statuses(ws / "ledger.db")
        if "complete" in states and "running" in trials.values():
            break
        assert time.monotonic() < deadline and driver.poll() is None, "the search ended before it could be killed"
        time.sleep(0.2)
    driver.kill()  # SIGKILL: no clean-up of any kind
    driver.wait()
    before, _ = statuses(ws / "ledger.db")
    ledger = Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False)
    told_before = {p.number: p for p in ledger.search_points("crashy") if p.state == "complete"}

    again = subprocess.run(
        [*EXE, "submit", str(study), "--no-progress"], env=env, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0, again.stdout + again.stderr
    points = ledger.search_points("crashy")
    assert [p.number for p in points] == [0, 1, 2] and {p.state for p in points} == {"complete"}
    rows = {r.trial_key: r for r in ledger.trials("crashy")}
    assert len(rows) == 6 and {r.status for r in rows.values()} == {"succeeded"}
    for key, was in before.items():
        if was == "succeeded":
            assert rows[key].attempts == 1  # nothing that finished ran again
    for number, p in told_before.items():
        assert next(q for q in points if q.number == number).value == p.value
    told = optuna_trials(f"sqlite:///{ws / 'ledger.db'}", "crashy")
    assert [(t.number, t.state) for t in told] == [(n, optuna.trial.TrialState.COMPLETE) for n in range(3)]
    # The configurations an uninterrupted search asks for (the same sampler, seed and space).
    compiled = compile_study(loads(study.read_text()))
    fresh = optuna.create_study(sampler=seeded_sampler("tpe", 3), direction="maximize")
    space = {"train.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
             "model.params.loops": optuna.distributions.IntDistribution(1, 3)}  # fmt: skip
    for p in points:
        assert fresh.ask(space).params == p.params
        fresh.tell(p.number, p.value)
    assert {p.cell_hash for p in points} == {
        search_cell(compiled.study, compiled.bases[0], p.params).cell_hash for p in points
    }
