"""Held-out text that is really held out: documents deduplicated, split by document, eval windows decontaminated.

The language-model tasks (`charlm`, `text`) share these rules, so a held-out window is never a passage the model
could have memorised from its training text:

1. **Documents.** A corpus is a list of documents (a help topic, a Bible chapter, a module's source file, a local
   file). The split is by document, never by position inside one.
2. **Exact duplicates** (the same text up to whitespace: SHA-256 of the whitespace-normalised text) are removed,
   the first kept.
3. **Near duplicates** are removed too: a document is dropped when at least `NEAR_DUP_CONTAINMENT` (half) of its
   word 5-grams (lower-cased `\\w+` words; 5-grams hashed to 64 bits) occur in one longer document that is kept.
   Containment rather than Jaccard, so a topic copied whole into a larger one (pydoc's `customization` inside
   `specialnames`) counts as a duplicate, as does a near-identical copy (the stdlib's `encodings/cp*.py` tables).
   Documents are visited longest first (ties by hash), so the superset is the one kept. The pair counts are exact
   (an inverted index over the 5-grams), not a MinHash estimate.
4. **Split** by a keyed BLAKE2b hash of each kept document's normalised text: a fixed share to `test`, another to
   `val`, the rest to `train`. A document's side depends on its own text alone (adding a document moves no other).
5. **Decontaminated eval windows.** Natural text repeats short phrases across documents ("And the LORD spake unto
   Moses"), so even a clean document split leaves eval windows that occur verbatim in the training text. An eval
   window may start only where the `novel_chars` characters from its start occur nowhere in the training text
   (the n-gram decontamination of LM benchmarks). A window that appeared verbatim in training would contain that
   prefix, so the measured overlap (`overlap`) is 0 at every window length >= `novel_chars`.

`overlap(L)` is the reviewer's measure: the share of eval windows of L characters (from the eval windows' starts)
that occur verbatim in the training text, found through a sorted array of 64-bit polynomial hashes of every
L-character substring of the training text (numpy, built by doubling: log2 L passes; ~2 s on 14M characters).

Pure numpy and the standard library; caches live under `cache_dir()`.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SHINGLE_WORDS = 5
NEAR_DUP_CONTAINMENT = 0.5
SPLITS = ("train", "val", "test")
TRAIN, VAL, TEST = 0, 1, 2
_BASE = np.uint64(0x100000001B3)  # odd multiplier of the polynomial hash (mod 2^64)
_WORD = re.compile(r"\w+")


# --- where caches go ----------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """$STUDYRUNNER_CACHE_DIR, else $XDG_CACHE_HOME/studyrunner, else ~/.cache/studyrunner (created)."""
    root = os.environ.get("STUDYRUNNER_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "studyrunner")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename: a reader sees the old
    file or the whole new one, never a part (concurrent trials may race to write the same cache entry)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_arrays(path: Path, **arrays) -> None:
    """np.savez written atomically."""
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write(path, buf.getvalue())


def load_arrays(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of a cache file, or None where it is missing or unreadable (then it is rebuilt)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except (OSError, ValueError, KeyError, EOFError):
        return None


# --- documents ----------------------------------------------------------------------------------------------


def normalized(text: str) -> str:
    return " ".join(text.split())


def text_sha256(docs: list[str]) -> str:
    """SHA-256 of the exact documents, in order (each length-prefixed, so boundaries count)."""
    h = hashlib.sha256()
    for doc in docs:
        data = doc.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _hash64(data: bytes, salt: int) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, key=int(salt).to_bytes(8, "little")).digest(), "little")


def word_shingles(text: str, words: int = SHINGLE_WORDS, memo: dict[str, int] | None = None) -> np.ndarray:
    """Sorted unique 64-bit hashes of the document's lower-cased word n-grams (content-based: the same n-gram
    hashes the same in every document and process)."""
    memo = {} if memo is None else memo
    tokens = _WORD.findall(text.lower())
    if len(tokens) < words:
        return np.zeros(0, dtype=np.uint64)
    ids = np.empty(len(tokens), dtype=np.uint64)
    for i, w in enumerate(tokens):
        h = memo.get(w)
        if h is None:
            h = memo[w] = _hash64(w.encode("utf-8"), 0x5EED)
        ids[i] = h
    n = len(tokens) - words + 1
    out = ids[:n].copy()
    for k in range(1, words):
        out = out * _BASE + ids[k : k + n]
    return sorted_unique(out)


@dataclass
class Dedup:
    """Which documents survive deduplication, and why the others do not."""

    kept: list[int]  # indices into the input, in input order
    exact: dict[int, int] = field(default_factory=dict)  # removed -> the kept document it equals
    near: dict[int, tuple[int, float]] = field(default_factory=dict)  # removed -> (kept container, containment)

    def summary(self) -> dict[str, int]:
        return {"kept": len(self.kept), "exact_duplicates": len(self.exact), "near_duplicates": len(self.near)}


def deduplicate(docs: list[str], threshold: float = NEAR_DUP_CONTAINMENT, words: int = SHINGLE_WORDS) -> Dedup:
    """Exact duplicates (normalised text), then near duplicates (module docstring, rule 3)."""
    first: dict[str, int] = {}
    exact: dict[int, int] = {}
    unique: list[int] = []
    for i, doc in enumerate(docs):
        key = hashlib.sha256(normalized(doc).encode("utf-8")).hexdigest()
        if key in first:
            exact[i] = first[key]
        else:
            first[key] = i
            unique.append(i)
    memo: dict[str, int] = {}
    shingles = {i: word_shingles(docs[i], words, memo) for i in unique}
    # longest first; ties by content hash, so the order does not depend on the input order
    order = sorted(unique, key=lambda i: (-len(shingles[i]), hashlib.sha256(docs[i].encode()).hexdigest()))
    postings: dict[int, list[int]] = {}  # shingle -> kept documents (positions in `order`) holding it
    kept_rank: list[int] = []
    near: dict[int, tuple[int, float]] = {}
    for rank, i in enumerate(order):
        own = shingles[i]
        if len(own):
            hits: dict[int, int] = {}
            for s in own.tolist():
                for k in postings.get(s, ()):
                    hits[k] = hits.get(k, 0) + 1
            if hits:
                best = max(hits, key=lambda k: (hits[k], -k))
                share = hits[best] / len(own)
                if share >= threshold:
                    near[i] = (order[best], share)
                    continue
        kept_rank.append(rank)
        for s in own.tolist():
            postings.setdefault(s, []).append(rank)
    kept = sorted(order[r] for r in kept_rank)
    return Dedup(kept, exact, near)


def assign_splits(docs: list[str], salt: int, val_share: float, test_share: float, by_size: bool = False) -> np.ndarray:
    """TRAIN / VAL / TEST per document from a keyed hash of its normalised text (rule 4).

    Independently per document (a share of the documents; adding one moves no other), or `by_size` for a corpus
    of few documents of very different sizes (pydoc's 56 topics, 0.2k to 62k characters), where that would
    leave the held-out text's size to chance: documents in hash order fill `test`, then `val`, up to their share
    of the characters (a document that would overshoot its target by over a quarter is passed on)."""
    u = [_hash64(normalized(doc).encode("utf-8"), salt) / 2.0**64 for doc in docs]
    out = np.full(len(docs), TRAIN, dtype=np.int8)
    if not by_size:
        for i, x in enumerate(u):
            out[i] = TEST if x < test_share else VAL if x < test_share + val_share else TRAIN
        return out
    total = sum(len(d) for d in docs)
    fill = {TEST: 0, VAL: 0}
    target = {TEST: test_share * total, VAL: val_share * total}
    for i in sorted(range(len(docs)), key=u.__getitem__):
        for side in (TEST, VAL):
            if fill[side] < target[side] and fill[side] + len(docs[i]) <= 1.25 * target[side]:
                out[i] = side
                fill[side] += len(docs[i])
                break
    return out


# --- n-gram hashes and overlap ------------------------------------------------------------------------------


def codes_of(text: str) -> np.ndarray:
    """Unicode code points + 1 as uint64 (0 is reserved for the separator between documents)."""
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.uint64) + np.uint64(1)


def ngram_hashes(codes: np.ndarray, length: int) -> np.ndarray:
    """(len(codes) - length + 1,) polynomial hashes (mod 2^64) of every `length`-long substring, by doubling
    (log2 `length` passes, three arrays alive at a time)."""
    codes = np.asarray(codes, dtype=np.uint64)
    n = len(codes) - length + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    level, span, out, done = codes, 1, None, 0  # level: hashes of every substring of `span` characters
    while True:
        if length & span:  # this power of two is part of `length`: append it to what is composed so far
            part = level[done : done + n]
            out = part.copy() if out is None else out * (_BASE ** np.uint64(span)) + part
            done += span
        if span * 2 > length:
            return out
        m = len(level) - span
        level = level[:m] * (_BASE ** np.uint64(span)) + level[span : span + m]
        span *= 2


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique by an in-place sort (np.unique is an order of magnitude slower on 10M uint64 here)."""
    values = np.sort(values)
    if len(values):
        values = values[np.concatenate([[True], values[1:] != values[:-1]])]
    return values


def joined_codes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The documents' code points joined by a 0 separator, and each document's start offset in the result."""
    parts, starts, at = [], [], 0
    for t in texts:
        c = codes_of(t)
        starts.append(at)
        parts.extend([c, np.zeros(1, dtype=np.uint64)])
        at += len(c) + 1
    if not parts:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    return np.concatenate(parts), np.asarray(starts, dtype=np.int64)


class NgramSet:
    """Every `length`-character substring of a text (documents joined by a separator), as sorted hashes."""

    def __init__(self, codes: np.ndarray, length: int):
        self.length = length
        self.hashes = sorted_unique(ngram_hashes(codes, length))

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        if not len(self.hashes):
            return np.zeros(len(hashes), dtype=bool)
        at = np.searchsorted(self.hashes, hashes).clip(max=len(self.hashes) - 1)
        return self.hashes[at] == hashes


def novel_starts(train_codes: np.ndarray, held_codes: np.ndarray, length: int) -> np.ndarray:
    """(len(held_codes),) True where the `length` characters from that position lie inside one held-out document
    (no separator) and occur nowhere in the training text: where a decontaminated eval window may start."""
    ok = np.zeros(len(held_codes), dtype=bool)
    hashes = ngram_hashes(held_codes, length)
    if not len(hashes):
        return ok
    inside = _no_separator(held_codes, length)
    ok[: len(hashes)] = inside & ~NgramSet(train_codes, length).contains(hashes)
    return ok


def _no_separator(codes: np.ndarray, length: int) -> np.ndarray:
    seps = np.concatenate([[0], np.cumsum(codes == 0)])
    return (seps[length:] - seps[: len(codes) - length + 1]) == 0


def overlap(train_codes: np.ndarray, held_codes: np.ndarray, starts: np.ndarray, length: int) -> dict[str, float]:
    """The share of the `length`-character windows at `starts` (positions in `held_codes`) that occur verbatim in
    the training text; windows that would leave their document are not counted."""
    starts = np.asarray(starts, dtype=np.int64)
    hashes = ngram_hashes(held_codes, length)
    starts = starts[starts < len(hashes)]
    starts = starts[_no_separator(held_codes, length)[starts]]
    if not len(starts):
        return {"window_chars": length, "windows": 0, "share": float("nan")}
    seen = NgramSet(train_codes, length).contains(hashes[starts])
    return {"window_chars": length, "windows": int(len(starts)), "share": float(seen.mean())}


def overlap_method(length: int) -> str:
    """How `overlap` measured, in words (tasks/overlap.py shows it beside the share)."""
    return (
        f"exact: each eval window's first {length} characters against every {length}-character substring of "
        "the training documents (64-bit hashes), a superset of any training window any seed can draw"
    )
