"""How a trial attempt ends: succeeded, diverged or error, each with one final report;
infrastructure failures propagate for Tune to retry; heartbeats, notes, provenance, default checkpoints.

The trainable's logic is `run_attempt(payload, report)`, called here in-process with `report` a list's
append; `trainable(config)` only adds `tune.report` and the device Ray assigned."""

import re
import subprocess
import sys

import pytest
from conftest import TINY_STUDY

from studyrunner.errors import SpecError
from studyrunner.orchestrate.cluster import attempt as mod
from studyrunner.orchestrate.cluster.attempt import KILL_MARKER, TuneReporter, run_attempt
from studyrunner.provenance import provenance
from studyrunner.study import compile_study, loads
from studyrunner.train import Diverged, MemoryReporter, run_trial
from studyrunner.train.checkpoint import Checkpoints, LocalStorage, default_every

TIMING = {"tokens_per_sec", "step_time_ms", "train_time_s"}  # wall-clock: never reproducible
PROVENANCE_KEYS = {
    "git_sha",
    "git_dirty",
    "studyrunner_version",
    "torch_version",
    "ray_version",
    "mlflow_version",
    "python_version",
    "host",
}
# An attempt's first report adds the worker process (orchestrate/cluster/warm_workers.process_facts).
ATTEMPT_PROVENANCE_KEYS = PROVENANCE_KEYS | {"pid", "process_started_at", "process_age_s"}


def cell(**train):
    config = compile_study(loads(TINY_STUDY)).cells[1].config  # loops: 2, 12 steps, log_every 4, eval every 6
    config["train"].update(train)
    return config


def payload(config=None, **extra):
    return {"trial_key": "tiny-abc-s0", "seed": 0, "cell": config or cell(), "threads": 1, "inject": None, **extra}


def attempt(trial, **kwargs):
    sent = []
    outcome = run_attempt(trial, sent.append, device="cpu", **kwargs)
    return outcome, sent


def finals(sent):
    return [r for r in sent if r.get("final")]


def strip(metrics):
    return {k: v for k, v in metrics.items() if k not in TIMING}


# ---------------------------------------------------------------------------------------- outcomes


def test_success_ends_with_one_final_report():
    outcome, sent = attempt(payload())
    assert outcome == "succeeded"
    [final] = finals(sent)
    assert final is sent[-1]
    assert set(final) == {"final", "outcome", "step", "metrics"}
    assert final["outcome"] == "succeeded" and final["step"] == 12
    assert strip(final["metrics"]) == strip(run_trial(cell(), 0))
    first = sent[0]  # the attempt's facts ride on its first report
    assert first["step"] == 0 and first["metrics"]["effective_depth"] == 2
    assert first["resumed_from_step"] == 0 and set(first["provenance"]) == ATTEMPT_PROVENANCE_KEYS
    assert first["facts"]["device"] == "cpu"
    assert all("provenance" not in r and "facts" not in r for r in sent[1:])
    assert [r["step"] for r in sent if "metrics" in r and not r["final"]] == [0, 4, 6, 8, 12]


def test_an_injected_nan_ends_the_trial_as_diverged_keeping_its_metrics():
    outcome, sent = attempt(payload(inject={"nan_at": 7}))
    assert outcome == "diverged"  # returned, not raised: no retry
    [final] = finals(sent)
    assert final["outcome"] == "diverged" and final["step"] == 7
    assert final["reason"] == "train loss is nan at step 7"
    metrics = final["metrics"]
    assert metrics["params"] > 0 and metrics["effective_depth"] == 2  # static facts
    records = {k: v for r in sent if "metrics" in r and not r["final"] for k, v in r["metrics"].items()}
    assert metrics["train_loss"] == records["train_loss"]  # the step 4 record: the last finite one
    assert metrics["eval_accuracy"] == records["eval_accuracy"]  # step 6
    assert metrics["train_time_s"] > 0 and metrics["step_time_ms"] > 0  # over the 6 steps taken
    assert [r["step"] for r in sent if "metrics" in r and not r["final"]] == [0, 4, 6]


def test_a_non_finite_loss_raises_diverged_from_the_trainer():
    reporter = MemoryReporter()
    with pytest.raises(Diverged) as caught:
        run_trial(cell(), 0, reporter, nan_at=1)
    assert caught.value.step == 1 and caught.value.reason == "train loss is nan at step 1"
    assert caught.value.metrics["params"] == reporter.rows[0]["params"]
    assert "step_time_ms" not in caught.value.metrics  # no step was timed


def test_the_divergence_rule_stops_the_trial_at_the_first_record_it_holds_on():
    outcome, sent = attempt(payload(divergence="train_loss > 0"))
    assert outcome == "diverged"
    [final] = finals(sent)
    assert final["step"] == 4  # the first record with a train_loss (the step 0 record has none)
    assert final["reason"].startswith("divergence rule 'train_loss > 0' holds at step 4 (train_loss=")
    assert final["metrics"]["train_loss"] == sent[1]["metrics"]["train_loss"]  # the record was sent first
    assert final["metrics"]["params"] > 0


def test_a_divergence_rule_that_never_holds_changes_nothing():
    outcome, sent = attempt(payload(divergence="train_loss > 1000 or eval_loss > 1000"))
    assert outcome == "succeeded"
    assert strip(finals(sent)[0]["metrics"]) == strip(run_trial(cell(), 0))


def test_a_bad_config_is_an_error_with_type_message_and_traceback():
    outcome, sent = attempt(payload(cell(betas=[0.9, 1.5])))  # AdamW refuses it on the worker
    assert outcome == "error"
    [final] = finals(sent)
    assert final["error_type"] == "ValueError"
    assert final["message"] == "Invalid beta parameter at index 1: 1.5"
    assert final["traceback"].startswith("Traceback") and "ValueError: Invalid beta" in final["traceback"]
    assert final["step"] == 0 and final["metrics"] == {}
    assert final["resumed_from_step"] == 0 and "provenance" in final  # the attempt's only report


def test_an_error_mid_run_keeps_the_latest_known_metrics(monkeypatch):
    import studyrunner.train.trainer as trainer

    real = trainer.evaluate_and_record

    def broken(model, task, splits, done, *args):
        if done == 6:
            raise KeyError("no such split")
        return real(model, task, splits, done, *args)

    monkeypatch.setattr(trainer, "evaluate_and_record", broken)
    outcome, sent = attempt(payload())
    assert outcome == "error"
    [final] = finals(sent)
    assert final["error_type"] == "KeyError" and final["message"] == "'no such split'"
    assert final["step"] == 5  # the last step that finished
    assert final["metrics"]["train_loss"] == sent[1]["metrics"]["train_loss"]


def test_an_injected_fault_is_an_error():
    outcome, sent = attempt(payload(inject_fault=True))
    assert outcome == "error"
    assert finals(sent)[0]["error_type"] == "InjectedFault" and len(sent) == 1


@pytest.mark.parametrize(
    "exc",
    [
        MemoryError(),
        mod.torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: out of memory"),
        ConnectionError("checkpoint storage went away"),
    ],
)
def test_infrastructure_failures_propagate_for_tune_to_retry(monkeypatch, exc):
    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(mod, "run_trial", fail)
    sent = []
    with pytest.raises(type(exc)):
        run_attempt(payload(), sent.append, device="cpu")
    assert finals(sent) == []


# ---------------------------------------------------------------------------- heartbeats and notes


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_heartbeats_are_sent_only_after_heartbeat_s_of_silence():
    clock, sent = Clock(), []
    reporter = TuneReporter(sent.append, heartbeat_s=10, clock=clock)
    reporter.start(0)
    beats = []
    for step, now in [(1, 105), (2, 110), (3, 115), (4, 118), (5, 127), (6, 128), (7, 140)]:
        clock.now = now
        if step == 4:
            reporter.log(4, {"train_loss": 1.0})  # a record resets the silence
        reporter.tick(step)
        beats += [r["step"] for r in sent if r.get("heartbeat")]
        sent[:] = [r for r in sent if not r.get("heartbeat")]
    assert beats == [2, 6, 7]


def test_the_heartbeat_interval_comes_from_the_payload(monkeypatch):
    clock = Clock()
    original = TuneReporter.tick

    def tick(self, step):  # the run's clock advances 1 s per step
        clock.now += 1
        original(self, step)

    monkeypatch.setattr(TuneReporter, "tick", tick)
    outcome, sent = attempt(payload(heartbeat_s=3), clock=clock)
    assert outcome == "succeeded"
    beats = [r for r in sent if r.get("heartbeat")]
    assert beats and all(set(r) == {"heartbeat", "step"} for r in beats)
    assert [r["step"] for r in beats] == [3, 10]  # 3 s after the records of steps 0 and 8


def test_notes_for_each_checkpoint_and_the_default_interval(tmp_path):
    outcome, sent = attempt(payload(cell(steps=20, warmup_steps=2), checkpoint_dir=str(tmp_path / "ck")))
    assert outcome == "succeeded"
    saved = [r for r in sent if "checkpoint_step" in r]
    assert [r["checkpoint_step"] for r in saved] == list(range(2, 21, 2))  # every max(1, 20 // 10) steps
    assert all(r["note"] == f"checkpoint written at step {r['step']}" for r in saved)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-000000018.ckpt", "step-000000020.ckpt"]


def test_the_default_checkpoint_interval_is_a_tenth_of_the_run():
    assert [default_every(n) for n in (1, 9, 10, 12, 100, 1005)] == [1, 1, 1, 1, 10, 100]
    store = Checkpoints(LocalStorage("unused"), config=cell(steps=100), seed=0)
    assert [s for s in range(1, 101) if store.due(s)] == list(range(10, 101, 10))
    explicit = Checkpoints(LocalStorage("unused"), config=cell(steps=100), seed=0, every=30)
    assert [s for s in range(1, 101) if explicit.due(s)] == [30, 60, 90, 100]


# ------------------------------------------------------------------------------ kill and resume


class Killed(BaseException):
    """What SIGKILL does to the attempt, in-process: nothing after it runs, nothing catches it."""


def test_a_killed_attempt_resumes_and_ends_bit_identical(tmp_path):
    trial = payload(checkpoint_dir=str(tmp_path), inject={"kill_at": 5})
    kills = []

    def kill():
        kills.append(1)
        raise Killed

    with pytest.raises(Killed):
        attempt(trial, kill=kill)
    assert (tmp_path / KILL_MARKER).exists()

    outcome, sent = attempt(trial, kill=kill)  # the retry: the marker says it was killed once already
    assert outcome == "succeeded" and len(kills) == 1
    assert sent[0]["note"] == f"resuming from checkpoint {tmp_path}/step-000000005.ckpt at step 5 of 12"
    assert sent[0]["resumed_from_step"] == 5 and "provenance" in sent[0]
    assert [r["step"] for r in sent if "metrics" in r and not r["final"]] == [6, 8, 12]

    _, uninterrupted = attempt(payload())
    final, expected = finals(sent)[0]["metrics"], finals(uninterrupted)[0]["metrics"]
    assert strip(final) == strip(expected)  # ==, not approx
    assert set(final) == set(expected)


def test_without_a_checkpoint_location_every_attempt_is_killed():
    def kill():
        raise Killed

    for _ in range(2):
        with pytest.raises(Killed):
            attempt(payload(inject={"kill_at": 3}), kill=kill)


def test_diverged_survives_pickling():
    import pickle

    again = pickle.loads(pickle.dumps(Diverged(7, "train loss is nan at step 7", {"params": 3.0})))
    assert (again.step, again.reason, again.metrics) == (7, "train loss is nan at step 7", {"params": 3.0})


# ------------------------------------------------------------------------------------ provenance


def test_provenance_names_the_code_and_the_machine():
    facts = provenance()
    assert set(facts) == PROVENANCE_KEYS and all(isinstance(v, str) and v for v in facts.values())
    assert re.fullmatch(r"[0-9a-f]{40}", facts["git_sha"]) or facts["git_sha"] == "unknown"
    assert facts["git_dirty"] in {"true", "false", "unknown"}
    assert facts["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert provenance() == facts  # cached


def test_provenance_without_git_is_unknown(monkeypatch):
    import studyrunner.provenance as prov

    monkeypatch.setattr(prov, "_git", lambda *args: None)
    assert prov._git_state() == ("unknown", "unknown")
    assert prov._version("surely-not-installed-package") == "absent"


@pytest.mark.e2e
def test_provenance_imports_nothing_of_the_platform():
    code = (
        "import sys, studyrunner.provenance as p; p.provenance(); "
        "print(sorted(m for m in ('torch', 'ray', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -------------------------------------------------------------------------------- the study file


def keys(text):
    compiled = compile_study(loads(text))
    return [t.trial_key for t in compiled.trials], [t.config for t in compiled.trials]


def test_divergence_and_retries_stay_out_of_cell_configs_and_hashes():
    study = loads(TINY_STUDY)
    assert study.divergence is None and study.retries == 2
    with_them = TINY_STUDY + 'divergence: "train_loss > 20 or not eval_accuracy >= 0"\nretries: 0\n'
    assert loads(with_them).retries == 0
    assert keys(with_them) == keys(TINY_STUDY)


@pytest.mark.parametrize(
    "extra,expected",
    [
        ('divergence: "train_loss >"', "divergence"),
        ("retries: -1", "retries"),
        ("retries: 1.5", "retries"),
    ],
)
def test_bad_divergence_or_retries_are_refused(extra, expected):
    with pytest.raises(SpecError, match=expected):
        loads(TINY_STUDY + extra + "\n")
