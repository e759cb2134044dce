"""A command that trains checks its settings and reaches its stores and its Ray before it writes anything: a
wrong environment variable or an unreachable `--address` leaves no workspace, no registered study and no
submission behind, in one line naming what to mend."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import TINY_STUDY
from typer.testing import CliRunner

from studyrunner import settings
from studyrunner.cli import app
from studyrunner.errors import StudyrunnerError
from studyrunner.store import Ledger
from studyrunner.study import compile_study, loads

runner = CliRunner()


@pytest.mark.parametrize("value,expected", [("", True), ("  ", True), ("0", False), ("off", False), ("YES", True)])
def test_an_empty_switch_reads_as_unset(monkeypatch, value, expected):
    monkeypatch.setenv("STUDYRUNNER_WARM_WORKERS", value)
    assert settings.switch("STUDYRUNNER_WARM_WORKERS", True) is expected


@pytest.mark.parametrize(
    "name,value,says",
    [
        ("STUDYRUNNER_WARM_WORKERS", "maybe", "neither on nor off"),
        ("STUDYRUNNER_PREFETCH", "2", "neither on nor off"),
        ("STUDYRUNNER_STALE_AFTER", "soon", "not a number of seconds"),
        ("STUDYRUNNER_HEARTBEAT", "0", "not a number of seconds above 0"),
        ("STUDYRUNNER_STOP_GRACE", "-1", "not a number of seconds"),
        ("STUDYRUNNER_STOP_GRACE", "inf", "not a number of seconds"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_variable(monkeypatch, name, value, says):
    monkeypatch.setenv(name, value)
    with pytest.raises(StudyrunnerError, match=f"{name}=.*{says}"):
        settings.check()


def _one_line(result, fragment: str, code: int = 1) -> None:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == code and len(lines) == 1 and fragment in lines[0], result.output


def test_a_bad_setting_stops_submit_before_anything_is_written(tmp_path, monkeypatch):
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY_STUDY)
    monkeypatch.setenv("STUDYRUNNER_WARM_WORKERS", "maybe")
    result = runner.invoke(app, ["submit", str(study), "--workspace", str(tmp_path / "ws")])
    _one_line(result, "STUDYRUNNER_WARM_WORKERS='maybe' is neither on nor off", code=2)  # input: as a usage error
    assert not (tmp_path / "ws").exists()


def test_an_unreachable_ray_stops_submit_before_anything_is_written(tmp_path):
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY_STUDY)
    result = runner.invoke(app, ["submit", str(study), "--workspace", str(tmp_path / "ws"), "--address", "127.0.0.1:1"])
    _one_line(result, "cannot reach the Ray cluster at '127.0.0.1:1'")
    assert "to run" not in result.output and not (tmp_path / "ws").exists()


def test_an_unreachable_ray_leaves_a_registered_study_as_it_was(tmp_path):
    """`resume` of a study with pending trials: no submission opened, no trial claimed, no resume hint."""
    url = f"sqlite:///{tmp_path / 'ws' / 'ledger.db'}"
    (tmp_path / "ws").mkdir()
    ledger = Ledger(url)
    ledger.register(compile_study(loads(TINY_STUDY)))
    before = {(t.trial_key, t.status, t.attempts) for t in ledger.trials("tiny")}
    result = runner.invoke(app, ["resume", "tiny", "--workspace", str(tmp_path / "ws"), "--address", "127.0.0.1:1"])
    _one_line(result, "cannot reach the Ray cluster")
    assert {(t.trial_key, t.status, t.attempts) for t in ledger.trials("tiny")} == before
    with sqlite3.connect(tmp_path / "ws" / "ledger.db") as con:
        assert con.execute("SELECT count(*) FROM submissions").fetchone()[0] == 0
