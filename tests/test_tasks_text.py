"""The `text` task (tasks/text.py) and its held-out rules (tasks/textdata.py): the loader reads local files through
`datasets`, the BPE trains deterministically and round-trips, duplicates and near duplicates are removed before a
split by document, eval windows are a per-seed draw from held-out documents only, and the measured overlap with
the training text is 0 on the default corpus at the window lengths the studies use."""

import math

import numpy as np
import pytest
import torch

from studyrunner.tasks import build_task
from studyrunner.tasks import text as text_task
from studyrunner.tasks import textdata as td

WORDS = (
    "river stone light morning garden window silver thunder quiet harbor meadow lantern copper winter orchard "
    "whisper candle mountain shadow feather valley compass timber meadowlark ember glacier willow beacon "
    "prairie canyon summit marble velvet horizon cobalt juniper lagoon pebble saffron tundra"
).split()


def sentence_doc(rng: np.random.Generator, words: int = 120) -> str:
    picks = rng.choice(len(WORDS), size=words)
    lines = [" ".join(WORDS[i] for i in picks[j : j + 12]) + "." for j in range(0, words, 12)]
    return "\n".join(lines).capitalize()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh on-disk cache and empty in-process caches for every test."""
    monkeypatch.setenv("STUDYRUNNER_CACHE_DIR", str(tmp_path / "cache"))
    saved = [dict(m) for m in (text_task._CORPORA, text_task._ENCODERS, text_task._DATA)]
    for m in (text_task._CORPORA, text_task._ENCODERS, text_task._DATA):
        m.clear()
    yield tmp_path / "cache"
    for m, old in zip((text_task._CORPORA, text_task._ENCODERS, text_task._DATA), saved, strict=True):
        m.clear()
        m.update(old)


PLANTED = (
    "The lighthouse keeper counted forty ships that autumn, each one flying a different flag, and wrote every "
    "name in a ledger bound with green thread so that the harbor master could read it in the spring."
)


@pytest.fixture
def corpus_dir(tmp_path):
    """160 small documents (one file each), with a planted exact duplicate and a planted near duplicate."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(160):
        (folder / f"doc{i:03d}.txt").write_text(sentence_doc(rng), encoding="utf-8")
    (folder / "planted_a.txt").write_text(PLANTED + "\n" + sentence_doc(rng, 24), encoding="utf-8")
    (folder / "planted_a_copy.txt").write_text(
        PLANTED + "\n" + (folder / "planted_a.txt").read_text()[len(PLANTED) + 1 :]
    )
    near = (folder / "planted_a.txt").read_text().replace("forty ships", "forty-one ships").replace("green", "red")
    (folder / "planted_a_near.txt").write_text(near + "\nA line added at the end.", encoding="utf-8")
    (folder / "unicode.txt").write_text("Café naïve — “quoted” 日本語 text.\n" + sentence_doc(rng), encoding="utf-8")
    return folder


def params(folder, **more):
    return {"data_files": [str(folder / "*.txt")], "vocab_size": 300, "seq_len": 16, **more}


# --- the loader and the tokenizer ------------------------------------------------------------------------------


def test_the_loader_reads_local_files_through_datasets(tmp_path, monkeypatch):
    import datasets

    calls = []
    real = datasets.load_dataset

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    (tmp_path / "a.txt").write_text("First paragraph.\nStill first.\n\nSecond paragraph.\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("Another file.\n", encoding="utf-8")
    files = [tmp_path / "a.txt", tmp_path / "b.txt"]
    assert text_task.load_texts(files, "document", tmp_path / "hf") == [
        "First paragraph.\nStill first.\n\nSecond paragraph.",
        "Another file.",
    ]
    assert text_task.load_texts(files[:1], "paragraph", tmp_path / "hf") == [
        "First paragraph.\nStill first.",
        "Second paragraph.",
    ]
    assert calls and all(args[0] == "text" for args, _ in calls)
    assert calls[0][1]["data_files"] == [str(f) for f in files] and calls[0][1]["sample_by"] == "document"


def test_bpe_trains_deterministically_and_round_trips(corpus_dir):
    texts = [p.read_text(encoding="utf-8") for p in sorted(corpus_dir.glob("*.txt"))]
    a, b = text_task.train_bpe(texts, 400), text_task.train_bpe(texts, 400)
    assert a.to_str() == b.to_str()  # the same merges, in the same order
    assert a.get_vocab_size() == 400
    enc = text_task.Encoder("bpe", a)
    sample = "Café naïve — “quoted” 日本語 river stone.\n  indented line"
    ids = enc.encode([sample])[0]
    assert enc.decode(ids) == sample
    assert enc.token_bytes[ids].sum() == len(sample.encode("utf-8"))  # bits per byte count the real bytes
    assert len(ids) < len(sample.encode("utf-8"))  # merges were learnt
    raw = text_task.Encoder("bytes")
    assert raw.decode(raw.encode([sample])[0]) == sample and raw.size == 256


# --- dedup and the split by document ---------------------------------------------------------------------------


def test_exact_and_near_duplicates_are_removed_before_the_split():
    rng = np.random.default_rng(1)
    base = [sentence_doc(rng) for _ in range(30)]
    docs = [
        *base,
        base[3],
        "  " + base[5].replace("\n", "  \n"),
        base[7].replace("river", "rivers", 1) + " extra words",
    ]
    dedup = td.deduplicate(docs)
    assert dedup.exact == {30: 3, 31: 5}  # identical up to whitespace
    assert set(dedup.near) == {32} or set(dedup.near) == {7}  # one of the near pair goes
    assert len(dedup.kept) == 30
    contained = base[9][: len(base[9]) * 3 // 4]  # three quarters of a document, copied into a shorter one
    assert set(td.deduplicate([base[9], contained]).near) == {1}


def test_the_split_is_by_document_and_fixed():
    rng = np.random.default_rng(2)
    docs = [sentence_doc(rng) for _ in range(400)]
    split = td.assign_splits(docs, 7, 1 / 16, 1 / 16)
    assert np.array_equal(split, td.assign_splits(docs[::-1], 7, 1 / 16, 1 / 16)[::-1])  # a document's own hash
    shares = np.bincount(split, minlength=3) / len(docs)
    assert 0.02 < shares[td.VAL] < 0.12 and 0.02 < shares[td.TEST] < 0.12
    sized = td.assign_splits(docs, 7, 0.1, 0.1, by_size=True)
    chars = np.asarray([len(d) for d in docs])
    for side in (td.VAL, td.TEST):
        assert 0.09 < chars[sized == side].sum() / chars.sum() < 0.13


def test_planted_duplicates_end_up_on_one_side_and_eval_windows_come_from_held_out_documents(corpus_dir, cache):
    task = build_task("text", params(corpus_dir), seed=0)
    corpus = task.data.corpus
    summary = corpus.meta["dedup"]
    assert summary["exact_duplicates"] == 1 and summary["near_duplicates"] >= 1
    holding = [s for d, s in zip(corpus.docs, corpus.split.tolist(), strict=True) if "lighthouse keeper" in d]
    assert len(holding) == 1  # one copy of the planted passage survives: on one side only
    train, val, test = (corpus.texts(k) for k in (td.TRAIN, td.VAL, td.TEST))
    assert val and test and len(train) > 100
    enc = task.data.encoder

    def texts_of(batch):
        return [
            enc.decode(torch.cat([row[:1], t]).tolist()) for row, t in zip(batch.inputs, batch.targets, strict=True)
        ]

    eval_a = task.eval_sets(48)[""]
    for window in texts_of(eval_a):
        assert any(window in doc for doc in test)
        assert not any(window[:17] in doc for doc in train)  # decontaminated: not even its first 17 characters
    for window in texts_of(task.validation_sets(24)[""]):
        assert any(window in doc for doc in val)
    eval_b = build_task("text", params(corpus_dir), seed=1).eval_sets(48)[""]
    assert not torch.equal(eval_a.inputs, eval_b.inputs)  # each seed its own draw
    again = build_task("text", params(corpus_dir), seed=0).eval_sets(48)[""]
    assert torch.equal(eval_a.inputs, again.inputs)  # ... fixed per seed
    fixed = [build_task("text", params(corpus_dir, eval_seed=3), seed=s).eval_sets(48)[""] for s in (0, 1)]
    assert torch.equal(fixed[0].inputs, fixed[1].inputs)  # eval_seed: one draw for every seed
    assert task.overlap(17)["share"] == 0.0 and task.overlap()["share"] == 0.0
    batch = task.train_batch(3, 8)
    assert torch.equal(batch.inputs, build_task("text", params(corpus_dir), seed=0).train_batch(3, 8).inputs)
    for window in texts_of(batch):
        assert any(window in doc for doc in train)


def test_the_tokenizer_is_cached_on_disk_and_the_fingerprint_names_the_text(corpus_dir, cache, monkeypatch):
    task = build_task("text", params(corpus_dir), seed=0)
    first = task.fingerprint()
    assert first["sha256"] == td.text_sha256(task.data.corpus.docs)
    assert first["tokenizer"]["kind"] == "bpe" and first["tokenizer"]["vocab_size"] == 300
    assert "data_files" in first["sources"] and first["splits"]["test"]["documents"] > 0
    assert list(cache.glob("text/tokenizer-*.json")) and list(cache.glob("text/corpus-*.npz"))
    for memo in (text_task._CORPORA, text_task._ENCODERS, text_task._DATA):
        memo.clear()  # a new process: everything comes from the disk cache, nothing is trained again
    real = text_task.train_bpe
    monkeypatch.setattr(text_task, "train_bpe", lambda *a: pytest.fail("the tokenizer was trained again"))
    again = build_task("text", params(corpus_dir), seed=0)
    assert again.fingerprint() == first
    assert torch.equal(again.eval_sets(8)[""].inputs, task.eval_sets(8)[""].inputs)
    monkeypatch.setattr(text_task, "train_bpe", real)  # another text: another tokenizer
    (corpus_dir / "doc000.txt").write_text("A changed document.\n" * 40, encoding="utf-8")
    changed = build_task("text", params(corpus_dir), seed=0).fingerprint()
    assert changed["sha256"] != first["sha256"]


# --- metrics and levels ----------------------------------------------------------------------------------------


def test_perplexity_and_bits_per_byte(corpus_dir, cache):
    task = build_task("text", params(corpus_dir), seed=0)
    batch = task.eval_sets(16)[""]
    v = task.facts.vocab_size
    uniform = task.metrics(torch.zeros(*batch.targets.shape, v), batch)
    nbytes = int(task.token_bytes[batch.targets].sum())
    assert uniform["perplexity"] == pytest.approx(v, rel=1e-5)
    assert uniform["bpb"] == pytest.approx(math.log2(v) * batch.targets.numel() / nbytes, rel=1e-5)
    raw = build_task("text", params(corpus_dir, tokenizer="bytes"), seed=0)
    rb = raw.eval_sets(16)[""]
    logits = torch.randn(*rb.targets.shape, 256, generator=torch.Generator().manual_seed(0))
    got = raw.metrics(logits, rb)
    assert got["bpb"] == pytest.approx(raw.loss(logits, rb).item() / math.log(2), rel=1e-5)  # a token is a byte
    assert got["perplexity"] == pytest.approx(math.exp(raw.loss(logits, rb).item()), rel=1e-5)


def test_levels_declare_chance_and_the_unigram_floor(corpus_dir, cache):
    task = build_task("text", params(corpus_dir), seed=0)
    levels = task.metric_levels(64)
    v = task.data.encoder.size
    assert levels["eval_loss"].chance == pytest.approx(math.log(v))
    assert levels["eval_perplexity"].chance == v and levels["eval_perplexity"].best == 1.0
    assert levels["eval_accuracy"].chance == pytest.approx(1 / v)
    for name in ("eval_loss", "eval_perplexity", "eval_bpb"):
        lv = levels[name]
        assert not lv.higher_is_better and lv.floor is not None and lv.floor < lv.chance
        assert "unigram" in lv.floor_strategy
    assert levels["eval_perplexity"].floor == pytest.approx(math.exp(levels["eval_loss"].floor))
    ratio = levels["eval_bpb"].chance / levels["eval_loss"].chance
    assert levels["eval_bpb"].floor / levels["eval_loss"].floor == pytest.approx(ratio)  # same bytes per token
    assert task.reported_metrics() >= {"eval_perplexity", "eval_bpb", "eval_loss", "eval_accuracy"}


def test_building_the_task_reads_nothing_until_data_is_needed(monkeypatch):
    monkeypatch.setattr(text_task, "text_data", lambda p: pytest.fail("read the corpus"))
    task = build_task("text", {"vocab_size": 1024, "seq_len": 64}, seed=0)
    assert task.facts.vocab_size == 1024 and task.facts.seq_len == 64 and task.facts.causal
    assert build_task("text", {"tokenizer": "bytes"}, seed=0).facts.vocab_size == 256


# --- the default corpus ----------------------------------------------------------------------------------------


def test_the_default_corpus_leaks_nothing_at_the_studies_window_lengths():
    """The default corpus (KJV + the standard library): >= 10M characters of real text, and no eval window's
    first 17, 65 or 129 characters occur in the training text. The first run reads, deduplicates and tokenises
    the corpus (about a minute) and caches it; later runs take seconds."""
    task = build_task("text", {}, seed=0)
    facts = task.fingerprint()
    assert facts["chars"] >= 10_000_000 and set(facts["sources"]) == {"kjv", "stdlib"}
    assert facts["dedup"]["near_duplicates"] > 0
    for length in (17, 65, 129):
        got = task.overlap(length, examples=512)
        assert got["windows"] == 512 and got["share"] == 0.0, got
    # the check bites: without the decontaminated starts, short windows do occur in training
    data = task.data.splits["test"]
    starts = data.window_starts(task.p.seq_len + 1)[::97]
    natural = td.overlap(task.data.codes(td.TRAIN), task.data.codes(td.TEST), data.char_pos[starts], 17)
    assert natural["share"] > 0.05
