"""Trial checkpoints: an interrupted and resumed trial ends bit-identical to one that
never stopped; corrupt checkpoints fall back and say so; another trial's checkpoint is refused.

Interruptions are injected by a reporter that raises when asked to log step s (the one test double)."""

import functools
import random

import numpy as np
import pytest
import torch

from studyrunner.study import compile_study, loads
from studyrunner.tasks import build_task
from studyrunner.tasks.registry import TASKS
from studyrunner.train import MemoryReporter, run_trial
from studyrunner.train.checkpoint import (
    CheckpointMismatch,
    CheckpointWarning,
    CorruptCheckpoint,
    LocalStorage,
    checkpoint_name,
    decode,
    encode,
)

STUDY = """\
name: ckpt
task: {{name: phop, params: {{alphabet: 4, seq_len: 10, hops: 1}}}}
model: {{family: {family}, params: {{d_model: 16, n_heads: 2, {model}}}}}
train: {{steps: 12, batch_size: 8, warmup_steps: 2, log_every: 3, {train}}}
eval: {{every: 6, examples: 16, loops: [1, 4]}}
seeds: [0]
"""
FAMILIES = {
    "looped": ("loops: 2", ""),
    # a halting family mid-way through its ponder warmup at every checkpoint
    "ut_act": ("loops: 3, memory_slots: 2, act: true", "ponder_lambda: 0.01, ponder_lambda_warmup_steps: 8"),
    # a shortcut trajectory drawn from torch's generator in every training forward
    "loopformer": ("loops: 4, shortcut_sampler: grid_sequential", ""),
}
TIMING = {"tokens_per_sec", "step_time_ms", "train_time_s"}  # wall-clock: never reproducible


def config(family="looped", checkpoint_every=None, extra=""):
    model, train = FAMILIES[family]
    train = ", ".join(
        t for t in (train, extra, f"checkpoint_every: {checkpoint_every}" if checkpoint_every else "") if t
    )
    return compile_study(loads(STUDY.format(family=family, model=model, train=train))).cells[0].config


def strip(metrics):
    return {k: v for k, v in metrics.items() if k not in TIMING}


@functools.cache
def uninterrupted(family, seed=0):
    """(final metrics, records) of a run that never stops and writes no checkpoints."""
    reporter = MemoryReporter()
    final = run_trial(config(family), seed, reporter)
    return strip(final), [strip(row) for row in reporter.rows]


class Interrupted(Exception):
    pass


class CrashAt(MemoryReporter):
    """Dies when asked to log step `at`, before that record is delivered."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def log(self, step, metrics):
        if step == self.at:
            raise Interrupted(step)
        super().log(step, metrics)


def interrupt(cfg, folder, at, seed=0):
    with pytest.raises(Interrupted):
        run_trial(cfg, seed, CrashAt(at), checkpoints=folder)


def steps_in(folder):
    return sorted(int(p.name[5:14]) for p in folder.iterdir() if p.name.endswith(".ckpt"))


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize(
    "every,at,resumes_at",
    [
        (4, 6, 4),  # between checkpoints, mid train window, at an eval step
        (4, 9, 8),  # the record after a checkpoint (two steps of window in the checkpoint)
        (3, 9, 6),  # at a checkpoint step, before its checkpoint was written
    ],
)
def test_interrupted_and_resumed_ends_bit_identical(tmp_path, family, every, at, resumes_at):
    cfg = config(family, checkpoint_every=every)
    interrupt(cfg, tmp_path, at)
    assert steps_in(tmp_path)[-1] == resumes_at

    reporter = MemoryReporter()
    final = run_trial(cfg, 0, reporter, checkpoints=tmp_path)

    expected_final, expected_rows = uninterrupted(family)
    assert strip(final) == expected_final  # ==, not approx
    assert set(final) == set(expected_final) | TIMING
    # the resumed attempt's records are the uninterrupted run's: up to its checkpoint replayed from the
    # checkpoint (a driver that died may have missed them), after it computed again
    assert [strip(row) for row in reporter.rows] == expected_rows
    assert reporter.notes == [
        f"resuming from checkpoint {tmp_path}/{checkpoint_name(resumes_at)} at step {resumes_at} of 12"
    ]
    assert steps_in(tmp_path) == [12 - every, 12]  # every `every` steps and at the end; newest 2 kept


def test_the_step_is_the_data_position():
    """Train batches are a function of (task params, seed, step): nothing else needs saving."""
    for name in TASKS:
        fresh = build_task(name, {}, 7).train_batch(5, 8)
        task = build_task(name, {}, 7)
        for step in range(5):  # a task that has served other batches first
            task.train_batch(step, 8)
        torch.manual_seed(123), np.random.seed(123), random.seed(123)  # global generators play no part
        again = task.train_batch(5, 8)
        for field in ("inputs", "targets", "loss_mask"):
            assert torch.equal(getattr(fresh, field), getattr(again, field)), (name, field)
        assert not torch.equal(build_task(name, {}, 8).train_batch(5, 8).inputs, fresh.inputs), name


def test_a_finished_trial_resumes_at_its_end(tmp_path):
    cfg = config()
    first = run_trial(cfg, 0, checkpoints=tmp_path)
    assert steps_in(tmp_path) == [11, 12]  # checkpoint_every unset: every max(1, 12 // 10) steps, newest 2
    first_rows = MemoryReporter()
    run_trial(cfg, 0, first_rows, checkpoints=tmp_path / "again")
    reporter = MemoryReporter()
    again = run_trial(cfg, 0, reporter, checkpoints=tmp_path)
    assert again == first  # timings included: they are the checkpoint's totals
    # nothing is trained again; the whole curve is replayed from the final checkpoint
    assert [r["step"] for r in reporter.rows] == [r["step"] for r in first_rows.rows] == [0, 3, 6, 9, 12]


def corrupt(path, how):
    data = path.read_bytes()
    if how == "flipped":
        path.write_bytes(data[:-100] + bytes([data[-100] ^ 1]) + data[-99:])
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["flipped", "truncated", "empty"])
def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, how):
    cfg = config(checkpoint_every=4)
    interrupt(cfg, tmp_path, at=9)
    corrupt(tmp_path / checkpoint_name(8), how)

    reporter = MemoryReporter()
    with pytest.warns(CheckpointWarning, match="step-000000008.ckpt is unusable.*falling back to step-000000004"):
        final = run_trial(cfg, 0, reporter, checkpoints=tmp_path)
    assert strip(final) == uninterrupted("looped")[0]
    assert "is unusable" in reporter.notes[0]
    assert reporter.notes[1].endswith("at step 4 of 12 (1 newer unusable: step-000000008.ckpt)")
    # replayed from the step-4 checkpoint up to it, then trained again from step 4 on
    assert [strip(r) for r in reporter.rows] == uninterrupted("looped")[1]
    assert steps_in(tmp_path) == [8, 12]  # the corrupt one was replaced on the way


def test_all_checkpoints_corrupt_starts_from_step_zero(tmp_path):
    cfg = config("ut_act", checkpoint_every=4)
    interrupt(cfg, tmp_path, at=9)
    for step in (4, 8):
        corrupt(tmp_path / checkpoint_name(step), "flipped")

    reporter = MemoryReporter()
    with pytest.warns(CheckpointWarning) as caught:
        final = run_trial(cfg, 0, reporter, checkpoints=tmp_path)
    messages = [str(w.message) for w in caught]
    assert "falling back to step-000000004.ckpt" in messages[0]
    assert "no earlier checkpoint: starting from step 0" in messages[1]
    assert "every checkpoint" in messages[2] and "training from step 0" in messages[2]
    assert strip(final) == uninterrupted("ut_act")[0]
    assert [strip(r) for r in reporter.rows] == uninterrupted("ut_act")[1]  # step 0 record included


def test_a_checkpoint_of_another_trial_is_refused(tmp_path):
    interrupt(config(checkpoint_every=4), tmp_path, at=9)
    with pytest.raises(CheckpointMismatch, match=r"another trial \(seed: checkpoint 0, this trial 1\)"):
        run_trial(config(checkpoint_every=4), 1, checkpoints=tmp_path)
    with pytest.raises(CheckpointMismatch, match=r"train\.lr: checkpoint 0\.001, this trial 0\.002"):
        run_trial(config(checkpoint_every=4, extra="lr: 2.0e-3"), 0, checkpoints=tmp_path)
    # checkpoint_every does not change results, so another value still resumes
    final = run_trial(config(checkpoint_every=5), 0, checkpoints=tmp_path)
    assert strip(final) == uninterrupted("looped")[0]


def test_any_pyarrow_filesystem_uri(tmp_path):
    uri = (tmp_path / "store").as_uri()  # file:///...; s3://, gs://, hdfs:// go the same way
    cfg = config(checkpoint_every=4)
    interrupt(cfg, uri, at=6)
    reporter = MemoryReporter()
    final = run_trial(cfg, 0, reporter, checkpoints=uri)
    assert strip(final) == uninterrupted("looped")[0]
    assert reporter.notes[0].startswith(f"resuming from checkpoint {uri}/step-000000004.ckpt")
    assert steps_in(tmp_path / "store") == [8, 12]


def test_format_detects_damage_and_writes_atomically(tmp_path):
    data = encode({"step": 3, "x": torch.arange(4)})
    assert decode(data)["step"] == 3
    for bad, why in [
        (data[:-1], "truncated"),
        (data[:10], "bad header"),
        (data[:-1] + bytes([data[-1] ^ 0xFF]), "checksum mismatch"),
        (data + b"x", "truncated"),  # appended bytes: the length no longer matches
    ]:
        with pytest.raises(CorruptCheckpoint, match=why):
            decode(bad)
    storage = LocalStorage(tmp_path / "a" / "b")
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / ".tmp-dead-step-000000001.ckpt").write_bytes(b"half")  # a writer that died
    run_trial(config(), 0, checkpoints=storage)
    assert storage.names() == [checkpoint_name(11), checkpoint_name(12)]  # no temporary files left behind


def test_a_checkpoint_from_before_a_new_aux_term_resumes_but_a_changed_weight_is_refused(tmp_path):
    """Checkpoints record every aux term's weight; a term added to the code since (a new family's) is a new
    knob, not a change of schedule, so older checkpoints stay usable; a weight that differs is refused."""
    from studyrunner.train.checkpoint import decode, encode

    cfg = config(checkpoint_every=4)
    interrupt(cfg, tmp_path, at=9)
    path = tmp_path / checkpoint_name(8)
    state = decode(path.read_bytes())
    state["schedule"]["aux_weights"].pop("consistency")  # as written before that term existed
    path.write_bytes(encode(state))
    final = run_trial(cfg, 0, checkpoints=tmp_path)
    assert strip(final) == uninterrupted("looped")[0]

    interrupt(cfg, tmp_path / "b", at=9)
    path = tmp_path / "b" / checkpoint_name(8)
    state = decode(path.read_bytes())
    state["schedule"]["aux_weights"]["regulariser"] = 0.5
    path.write_bytes(encode(state))
    with pytest.raises(CheckpointMismatch, match="the schedule code changed"):
        run_trial(cfg, 0, checkpoints=tmp_path / "b")
