"""Task `charlm`: character-level language modelling of a real text that ships with Python.

The text is the standard library's `pydoc_data.topics` (the help topics: ~465k characters of English prose and
grammar, always installed), read at run time: one document per topic (79 on 3.11), in key order. It depends on
the running Python's version; `fingerprint()` records the source, the SHA-256 of the documents used and the split.

Characters map to a fixed vocabulary of 97 ids, the same for any text: newline, the 95 printable ASCII
characters, and one id for everything else (a handful of typographic characters here). Every position
predicts the next character; `eval_bpc` is the cross-entropy in bits per character (`eval_loss` / ln 2),
`eval_accuracy` the share of characters predicted exactly (`eval_exact_match`: whole windows).

Held-out text (tasks/textdata.py, the rules `text` follows too). The help topics repeat each other: `specialnames`
holds `customization`, `attribute-access` and five more whole, `compound` holds `if`, `while`, `try`, ...; split
by 2,048-character blocks, 94% of the 17-character eval windows would occur verbatim in the training text. So:

- exact and near duplicates are removed first (22 topics contained in a longer one, 1 exact copy: 56 topics,
  ~373k characters remain);
- the split is by topic, in keyed-hash order, to ~10% of the characters each for `test` and `val` (18 and 5
  topics, ~37k and ~39k characters), the rest (~297k) for training;
- eval windows start only where the next `novel_chars` (17) characters occur nowhere in the training text, so no
  eval window of 17 characters or more (the CPU studies' 17, the GPU studies' 65 and 129) appears verbatim in the
  training text: `overlap(L)` measures it (0 for every L >= `novel_chars`);
- each trial seed draws its own eval windows, uniformly over those starts in every test topic (`eval_seed: N`
  fixes one draw for every seed). `validation_sets(n)` draws the validation split the same way, for selection.

Training windows lie wholly inside one training topic (drawn uniformly from every such start, per (seed, step)).

Decoded (`decodes`): at the final evaluation the families with a KV cache also stream each held-out
window through their cache one character at a time (the true text, no feedback), reporting
`eval_decode_bpc` (equal to the teacher-forced value up to float rounding) and the cache's bytes per token.
"""

from __future__ import annotations

import hashlib
import math
import sys
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from ..params import StrictParams
from . import textdata as td
from .base import Batch, Task, TaskFacts
from .registry import register_task

_SALT = 0xC4A2
VOCAB = 97  # newline, printable ASCII 32..126, other
TEST_SHARE = VAL_SHARE = 0.1  # of the characters (by topic)


class CharlmParams(StrictParams):
    seq_len: int = Field(128, ge=2, le=8192, description="Characters per window (each predicts the next).")
    block_chars: int | None = Field(
        None, description="Ignored: the split is by topic. Accepted so study files that set it still load."
    )
    novel_chars: int = Field(
        17, ge=1, le=4096, description="Eval windows start only where this many characters occur nowhere in training."
    )
    eval_seed: int | None = Field(
        None, description="None: each trial seed draws its own eval windows; a number: one draw for every seed."
    )


@lru_cache(maxsize=1)
def load_text() -> str:
    """The help topics of this Python's `pydoc_data.topics`, in key order, joined by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def encode(text: str) -> np.ndarray:
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)
    ids = np.full(codes.shape, VOCAB - 1, dtype=np.int64)
    ids[codes == 10] = 0
    printable = (codes >= 32) & (codes <= 126)
    ids[printable] = codes[printable] - 31
    return ids


@lru_cache(maxsize=1)
def encoded_text() -> np.ndarray:
    return encode(load_text())


def text_facts() -> dict[str, str | int]:
    text = load_text()
    return {"chars": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest()}


@lru_cache(maxsize=1)
def topic_documents() -> tuple[list[str], list[str]]:
    """(topic names, texts) of the help topics, in key order."""
    from pydoc_data.topics import topics

    keys = sorted(topics)
    return keys, [topics[k] for k in keys]


class Documents:
    """The deduplicated topics, their split, and the joined text (topics separated by a blank line)."""

    def __init__(self):
        names, docs = topic_documents()
        self.dedup = td.deduplicate(docs)
        self.names = [names[i] for i in self.dedup.kept]
        self.docs = [docs[i] for i in self.dedup.kept]
        self.split = td.assign_splits(self.docs, _SALT, VAL_SHARE, TEST_SHARE, by_size=True)
        starts, at = [], 0
        for d in self.docs:
            starts.append(at)
            at += len(d) + 2
        self.starts = np.asarray(starts, dtype=np.int64)  # each topic's first character in `text`
        self.lengths = np.asarray([len(d) for d in self.docs], dtype=np.int64)
        self.text = encode("\n\n".join(self.docs))
        self._codes: dict[int, np.ndarray] = {}
        self._novel: dict[int, np.ndarray] = {}

    def window_starts(self, which: int, width: int) -> np.ndarray:
        """Every start in `text` of a `width`-character window inside one topic of split `which`."""
        rows = zip(self.starts.tolist(), self.lengths.tolist(), self.split.tolist(), strict=True)
        parts = [np.arange(a, a + n - width + 1) for a, n, s in rows if s == which and n >= width]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def codes(self, which: int) -> np.ndarray:
        """The split's topics as code points in a `textdata` joined array (positions differ from `text`'s)."""
        if which not in self._codes:
            self._codes[which] = td.joined_codes(self.texts(which))[0]
        return self._codes[which]

    def texts(self, which: int) -> list[str]:
        return [d for d, s in zip(self.docs, self.split.tolist(), strict=True) if s == which]

    def joined_position(self, which: int, starts: np.ndarray) -> np.ndarray:
        """Positions in `text` of topics of split `which` -> the same characters' positions in `codes(which)`."""
        firsts = self.starts[self.split == which]
        joined = np.concatenate([[0], np.cumsum(self.lengths[self.split == which] + 1)[:-1]])
        topic = np.searchsorted(firsts, starts, side="right") - 1
        return joined[topic] + (starts - firsts[topic])

    def novel(self, which: int, length: int) -> np.ndarray:
        """(len(text),) True where the `length` characters from there lie in one topic of split `which` and occur
        nowhere in the training topics."""
        if length not in self._novel.get(which, {}):
            held = self.codes(which)
            ok_joined = td.novel_starts(self.codes(td.TRAIN), held, length)
            out = np.zeros(len(self.text), dtype=bool)
            starts = self.window_starts(which, 1)
            out[starts] = ok_joined[self.joined_position(which, starts)]
            self._novel.setdefault(which, {})[length] = out
        return self._novel[which][length]


@lru_cache(maxsize=1)
def documents() -> Documents:
    return Documents()


class Charlm(Task):
    metric_kinds = ("accuracy", "exact_match", "bpc")
    decodes = True
    decode_feedback = False

    answer_choices = VOCAB

    def __init__(self, params: CharlmParams, seed: int):
        self.p, self.seed = params, seed
        self.docs = documents()
        self.text = self.docs.text
        self.facts = TaskFacts(vocab_size=VOCAB, seq_len=params.seq_len, causal=True)
        width = params.seq_len + 1
        self.train_starts = self.docs.window_starts(td.TRAIN, width)
        self.eval_starts = self._candidates(td.TEST)
        if not len(self.train_starts) or not len(self.eval_starts):
            raise ValueError(f"seq_len {params.seq_len} does not fit in the text's train and eval topics")

    def _candidates(self, which: int) -> np.ndarray:
        """Starts of the decontaminated eval windows of split `which` (positions in `text`)."""
        starts = self.docs.window_starts(which, self.p.seq_len + 1)
        return starts[self.docs.novel(which, self.p.novel_chars)[starts]]

    def _batch(self, starts: np.ndarray) -> Batch:
        windows = torch.from_numpy(self.text[starts[:, None] + np.arange(self.p.seq_len + 1)])
        inputs, targets = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
        return Batch(inputs, targets, torch.ones_like(targets, dtype=torch.bool))

    def train_batch(self, step: int, batch_size: int) -> Batch:
        rng = np.random.default_rng([self.seed, step, _SALT])
        return self._batch(self.train_starts[rng.integers(0, len(self.train_starts), size=batch_size)])

    def draw(self, which: int, examples: int) -> np.ndarray:
        """This trial's eval window starts (its seed, or `eval_seed`): uniform over the decontaminated starts of
        every topic of the split, without replacement while there are enough (beyond `eval_capacity`: repeats)."""
        candidates = self.eval_starts if which == td.TEST else self._candidates(which)
        seed = self.seed if self.p.eval_seed is None else self.p.eval_seed
        rng = np.random.default_rng([seed, _SALT, which])
        return candidates[rng.choice(len(candidates), size=examples, replace=examples > len(candidates))]

    def eval_sets(self, examples: int) -> dict[str, Batch]:
        return {"": self._batch(self.draw(td.TEST, examples))}

    def validation_sets(self, examples: int) -> dict[str, Batch]:
        """The validation split, shaped like `eval_sets` (for selection; never reported as `eval_*`)."""
        return {"": self._batch(self.draw(td.VAL, examples))}

    def eval_capacity(self) -> int | None:
        return len(self.eval_starts)

    def fingerprint(self) -> dict:
        """The text this task trains and evaluates on: source and version, SHA-256 of the topics used, dedup and
        split counts, the held-out topics."""
        d = self.docs
        return {
            "sources": {"pydoc": f"pydoc_data.topics of CPython {sys.version.split()[0]}"},
            "sha256": td.text_sha256(d.docs),
            "raw_sha256": text_facts()["sha256"],
            "documents": len(d.docs),
            "chars": int(d.lengths.sum()),
            "dedup": d.dedup.summary(),
            "splits": {
                name: {"documents": int((d.split == k).sum()), "chars": int(d.lengths[d.split == k].sum())}
                for k, name in enumerate(td.SPLITS)
            },
            "held_out": {
                name: [n for n, s in zip(d.names, d.split.tolist(), strict=True) if s == k]
                for k, name in ((td.VAL, "val"), (td.TEST, "test"))
            },
            "novel_chars": self.p.novel_chars,
        }

    def overlap(self, window_chars: int | None = None, examples: int = 512, split: str = "test") -> dict:
        """The share of this trial's eval windows (`examples` of them) whose first `window_chars` characters
        occur verbatim in the training text (0 for every length >= `novel_chars`); None: the whole window
        (`seq_len` + 1 characters), the exact train/eval overlap (tasks/overlap.py calls it so)."""
        length = self.p.seq_len + 1 if window_chars is None else window_chars
        which = td.TEST if split == "test" else td.VAL
        starts = self.docs.joined_position(which, self.draw(which, examples))
        out = td.overlap(self.docs.codes(td.TRAIN), self.docs.codes(which), starts, length)
        return out | {"method": td.overlap_method(length)}

    def heuristic_floors(self, batch: Batch) -> dict[str, tuple[float, str]]:
        """Unigram: every position predicted from the training text's character frequencies alone, without
        reading the context (the most frequent character for accuracy, the frequencies for the loss)."""
        counts = np.bincount(self._train_text(), minlength=VOCAB)
        freq = (counts + 1) / (counts.sum() + VOCAB)  # add-one: a character the training text lacks
        targets = batch.targets[batch.loss_mask].numpy()
        accuracy = float(np.mean(targets == int(np.argmax(freq))))
        nats = float(-np.log(freq[targets]).mean())
        strategy = "the training text's character frequencies, context ignored"
        return {"accuracy": (accuracy, strategy), "loss": (nats, strategy), "bpc": (nats / math.log(2), strategy)}

    def _train_text(self) -> np.ndarray:
        return encode("".join(self.docs.texts(td.TRAIN)))

    def metrics(self, logits: torch.Tensor, batch: Batch) -> dict[str, float]:
        mask = batch.loss_mask
        correct = (logits.argmax(-1) == batch.targets) & mask
        ce = F.cross_entropy(logits[mask], batch.targets[mask])
        return {
            "accuracy": correct.sum().item() / max(1, mask.sum().item()),
            "exact_match": (correct | ~mask).all(dim=1).float().mean().item(),  # a whole window right
            "bpc": ce.item() / math.log(2),
        }


@register_task("charlm", CharlmParams)
def build(params: CharlmParams, seed: int) -> Charlm:
    return Charlm(params, seed)
