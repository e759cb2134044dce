"""`charlm`'s held-out text (tasks/charlm.py, rules in tasks/textdata.py): split by help topic after removing exact
and near-duplicate topics, eval windows decontaminated and drawn per seed across the test topics, a validation
split apart, and a measured overlap of 0 at the window lengths the shipped studies use (17, 65, 129 characters:
seq_len 16 on CPU, 64 and 128 on GPU). Split by 2,048-character blocks, 94% / 58% / 32% of those windows
occurred verbatim in the training text."""

import numpy as np
import pytest
import torch

from studyrunner.tasks import build_task
from studyrunner.tasks import textdata as td
from studyrunner.tasks.charlm import VOCAB, documents


def window_texts(batch) -> list[str]:
    """The characters of each window (inputs then the last target), back from the 97-id vocabulary."""
    rows = torch.cat([batch.inputs, batch.targets[:, -1:]], dim=1).tolist()
    return ["".join("\n" if i == 0 else chr(i + 31) for i in row) for row in rows]


def printable(text: str) -> str:
    return "".join(c if c == "\n" or 32 <= ord(c) <= 126 else chr(VOCAB - 1 + 31) for c in text)


@pytest.mark.parametrize("seq_len", [16, 64, 128])
def test_no_eval_window_of_the_studies_lengths_occurs_in_the_training_text(seq_len):
    task = build_task("charlm", {"seq_len": seq_len}, seed=0)
    for length in (17, 65, 129):
        got = task.overlap(length, examples=512)
        assert got["share"] == 0.0, (length, got)
        # a longer window than the task's may run off the end of its topic: not counted
        assert got["windows"] == 512 if length <= seq_len + 1 else got["windows"] > 400
    assert task.overlap(examples=512)["window_chars"] == seq_len + 1  # the whole window, by default
    assert task.overlap(examples=512)["share"] == 0.0


def test_the_check_bites_natural_text_repeats_short_phrases():
    """Without the decontaminated starts, even a clean split by topic leaves 17-character windows that occur in
    the training text; shorter than `novel_chars`, the task's own windows do too."""
    docs = documents()
    starts = docs.window_starts(td.TEST, 17)
    natural = td.overlap(docs.codes(td.TRAIN), docs.codes(td.TEST), docs.joined_position(td.TEST, starts), 17)
    assert natural["share"] > 0.05
    assert build_task("charlm", {"seq_len": 16}, seed=0).overlap(8)["share"] > 0.05


def test_topics_are_deduplicated_then_split_by_topic():
    docs = documents()
    names = set(docs.names)
    assert "specialnames" in names and "customization" not in names  # contained whole in specialnames
    assert "compound" in names and "while" not in names
    summary = docs.dedup.summary()
    assert summary["exact_duplicates"] >= 1 and summary["near_duplicates"] >= 10
    sides = {
        td.SPLITS[s]: {n for n, k in zip(docs.names, docs.split.tolist(), strict=True) if k == s} for s in range(3)
    }
    assert sides["test"] and sides["val"] and not (sides["test"] & sides["val"])
    total = docs.lengths.sum()
    for side in (td.TEST, td.VAL):
        assert 0.05 < docs.lengths[docs.split == side].sum() / total < 0.15
    # no held-out topic shares half its word 5-grams with a training topic
    train = [td.word_shingles(t) for t in docs.texts(td.TRAIN)]
    for held in docs.texts(td.TEST) + docs.texts(td.VAL):
        own = td.word_shingles(held)
        if len(own):
            assert max(np.isin(own, t).mean() for t in train) < td.NEAR_DUP_CONTAINMENT


def test_eval_windows_come_from_test_topics_and_differ_per_seed():
    docs = documents()
    test, val, train = (docs.texts(k) for k in (td.TEST, td.VAL, td.TRAIN))
    test, val, train = ([printable(t) for t in side] for side in (test, val, train))
    task = build_task("charlm", {"seq_len": 16}, seed=0)
    batch = task.eval_sets(256)[""]
    for window in window_texts(batch):
        assert any(window in t for t in test) and not any(window in t for t in train)
    for window in window_texts(task.validation_sets(64)[""]):
        assert any(window in t for t in val) and not any(window in t for t in train)
    other = build_task("charlm", {"seq_len": 16}, seed=1).eval_sets(256)[""]
    assert not torch.equal(batch.inputs, other.inputs)  # each seed its own sample of the held-out text
    assert torch.equal(batch.inputs, build_task("charlm", {"seq_len": 16}, seed=0).eval_sets(256)[""].inputs)
    fixed = [build_task("charlm", {"seq_len": 16, "eval_seed": 0}, seed=s).eval_sets(64)[""] for s in (0, 7)]
    assert torch.equal(fixed[0].inputs, fixed[1].inputs)
    topics = {t for w in window_texts(batch) for t in test if w in t}
    assert len(topics) >= 5  # spread across the test topics, not the first windows of one


def test_training_windows_lie_inside_training_topics_and_old_params_still_load():
    docs = documents()
    train = [printable(t) for t in docs.texts(td.TRAIN)]
    task = build_task("charlm", {"seq_len": 32, "block_chars": 2048}, seed=0)  # block_chars: accepted, ignored
    for window in window_texts(task.train_batch(5, 32)):
        assert any(window in t for t in train)
    levels = task.metric_levels(128)
    assert levels["eval_bpc"].floor < levels["eval_bpc"].chance
    fp = task.fingerprint()
    assert fp["documents"] == len(docs.docs) and len(fp["sha256"]) == 64 and fp["held_out"]["test"]
