"""Warm trial workers (orchestrate/cluster/warm_workers.py): the embedded Ray's idle workers import the trainer as they
start, and Tune's trial actors land on them instead of on new, cold processes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import TINY_STUDY
from test_faults import wait_for

from studyrunner.errors import StudyrunnerError
from studyrunner.orchestrate import ensure_ray, submit
from studyrunner.orchestrate.cluster.ray_runtime import ray_session_dir
from studyrunner.orchestrate.cluster.warm_workers import system_config, tune_actors_on_warm_workers
from studyrunner.orchestrate.submission import _processes_of
from studyrunner.store import Ledger
from studyrunner.study import compile_study, loads
from studyrunner.workspace import Workspace


@pytest.fixture(scope="module")
def fresh_ray():
    import ray

    assert not ray.is_initialized()
    ensure_ray(num_cpus=2)
    yield ray_session_dir()
    ray.shutdown()


def idle_workers_holding_torch(session_dir: str) -> set[int]:
    """Ray's idle Python workers of this session (`ray::IDLE`) that have torch mapped in."""
    found = set()
    for pid in _processes_of(session_dir):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            maps = Path(f"/proc/{pid}/maps").read_text(errors="replace")
        except OSError:
            continue
        if cmdline.startswith(b"ray::IDLE") and "libtorch" in maps:
            found.add(pid)
    return found


@pytest.mark.e2e
def test_trials_run_on_idle_workers_that_loaded_the_trainer_before_the_study(fresh_ray, tmp_path):
    # Ray starts an idle worker per CPU (2): wait for both to hold torch, or a trial may land on the one still
    # loading it when the first was seen (as happened on a loaded machine)
    def both() -> set[int]:
        found = idle_workers_holding_torch(fresh_ray)
        return found if len(found) >= 2 else set()

    warm = wait_for(both, timeout=120, what="two warm idle workers")
    ws = Workspace.resolve(tmp_path)
    compiled = compile_study(loads(TINY_STUDY.replace("seeds: [0, 1]", "seeds: [0]")))
    submitted = datetime.now(UTC)
    result = submit(compiled, ws, show_progress=False, max_concurrent=1)
    assert len(result.succeeded) == 2
    ledger = Ledger(ws.db_url)
    attempts = [a for r in ledger.trials("tiny") for a in ledger.attempts(r.trial_key)]
    assert {int(a.provenance["pid"]) for a in attempts} <= warm  # the processes that were there, warm, before
    assert all(datetime.fromisoformat(a.provenance["process_started_at"]) < submitted for a in attempts)
    assert all(float(a.provenance["process_age_s"]) > 0 for a in attempts)
    # ... and train as a cold process does: the same final metrics as the trainer run here, on one thread.
    import torch

    from studyrunner.train import MemoryReporter, run_trial

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for row in ledger.trials("tiny"):
            trial = next(t for t in compiled.trials if t.trial_key == row.trial_key)
            final = run_trial(trial.config, trial.seed, MemoryReporter())
            assert final["eval_loss"] == row.metrics["eval_loss"], trial.cell
    finally:
        torch.set_num_threads(threads)


def test_tune_actor_classes_leave_out_the_lightning_variable_only_while_inside():
    from ray.tune.execution import class_cache

    assert class_cache.DEFAULT_ENV_VARS.get("PL_DISABLE_FORK") == "1"  # this Ray's Tune still sets it
    with tune_actors_on_warm_workers():
        assert "PL_DISABLE_FORK" not in class_cache.DEFAULT_ENV_VARS
    assert class_cache.DEFAULT_ENV_VARS.get("PL_DISABLE_FORK") == "1"


def test_the_switch_turns_both_off(monkeypatch):
    from ray.tune.execution import class_cache

    assert system_config()["preload_python_modules"] == ["studyrunner.orchestrate.cluster.trainable", "torch._dynamo"]
    monkeypatch.setenv("STUDYRUNNER_WARM_WORKERS", "0")
    assert system_config() == {}
    with tune_actors_on_warm_workers():
        assert class_cache.DEFAULT_ENV_VARS.get("PL_DISABLE_FORK") == "1"
    monkeypatch.setenv("STUDYRUNNER_WARM_WORKERS", "maybe")
    with pytest.raises(StudyrunnerError, match="STUDYRUNNER_WARM_WORKERS='maybe' is neither on nor off"):
        system_config()
