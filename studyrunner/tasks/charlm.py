"""Task `charlm`: character-level language modelling of a real text that ships with Python.

The text is the standard library's `pydoc_data.topics` (the help topics: ~465k characters of English
prose and grammar, always installed), read at run time: the topics in key order, joined by blank lines.
It depends on the running Python's version; the task records its length and SHA-256 (`text_facts`).

Characters map to a fixed vocabulary of 97 ids, the same for any text: newline, the 95 printable ASCII
characters, and one id for everything else (a handful of typographic characters here). Every position
predicts the next character; `eval_bpc` is the cross-entropy in bits per character (`eval_loss` / ln 2),
`eval_accuracy` the share of characters predicted exactly (`eval_exact_match`: whole windows).

Held-out text: the text is cut into blocks of `block_chars`; a fixed hash of each block's index sends 1
in 16 blocks to evaluation. Training windows lie wholly inside runs of training blocks (drawn uniformly
from every such start, per (seed, step)); the eval windows tile the held-out runs without overlap, in
order, so their number is finite (`eval_capacity`).

Decoded (`decodes`): at the final evaluation the families with a KV cache also stream each held-out
window through their cache one character at a time (the true text, no feedback), reporting
`eval_decode_bpc` (equal to the teacher-forced value up to float rounding) and the cache's bytes per token.
"""

from __future__ import annotations

import hashlib
import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from ..params import StrictParams
from .base import Batch, Task, TaskFacts
from .holdout import is_eval
from .registry import register_task

_SALT = 0xC4A2
VOCAB = 97  # newline, printable ASCII 32..126, other


class CharlmParams(StrictParams):
    seq_len: int = Field(128, ge=2, le=8192, description="Characters per window (each predicts the next).")
    block_chars: int = Field(
        2048, ge=256, le=65536, description="Granularity of the train/eval split of the text (1 block in 16 held out)."
    )

    @model_validator(mode="after")
    def _window_fits_a_block(self) -> CharlmParams:
        if self.seq_len + 1 > self.block_chars:
            raise ValueError(f"seq_len + 1 ({self.seq_len + 1}) must fit in block_chars ({self.block_chars})")
        return self


@lru_cache(maxsize=1)
def load_text() -> str:
    """The help topics of this Python's `pydoc_data.topics`, in key order, joined by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


@lru_cache(maxsize=1)
def encoded_text() -> np.ndarray:
    codes = np.frombuffer(load_text().encode("utf-32-le"), dtype="<u4").astype(np.int64)
    ids = np.full(codes.shape, VOCAB - 1, dtype=np.int64)
    ids[codes == 10] = 0
    printable = (codes >= 32) & (codes <= 126)
    ids[printable] = codes[printable] - 31
    return ids


def text_facts() -> dict[str, str | int]:
    text = load_text()
    return {"chars": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def _runs(n_chars: int, block: int, want_eval: bool) -> list[tuple[int, int]]:
    """[start, stop) character ranges of maximal runs of consecutive blocks on one side of the split."""
    blocks = math.ceil(n_chars / block)
    held = is_eval(np.arange(blocks, dtype=np.int64)[:, None], _SALT)
    runs, begin = [], None
    for b in range(blocks + 1):
        inside = b < blocks and bool(held[b]) == want_eval
        if inside and begin is None:
            begin = b
        elif not inside and begin is not None:
            runs.append((begin * block, min(b * block, n_chars)))
            begin = None
    return runs


class Charlm(Task):
    metric_kinds = ("accuracy", "exact_match", "bpc")
    decodes = True
    decode_feedback = False

    def __init__(self, params: CharlmParams, seed: int):
        self.p, self.seed = params, seed
        self.text = encoded_text()
        self.facts = TaskFacts(vocab_size=VOCAB, seq_len=params.seq_len, causal=True)
        width = params.seq_len + 1
        train = _runs(len(self.text), params.block_chars, want_eval=False)
        self.train_starts = np.concatenate(
            [np.arange(a, b - width + 1) for a, b in train if b - a >= width] or [np.zeros(0, dtype=np.int64)]
        )
        held = _runs(len(self.text), params.block_chars, want_eval=True)
        self.eval_starts = np.concatenate(
            [np.arange(a, b - width + 1, width) for a, b in held if b - a >= width] or [np.zeros(0, dtype=np.int64)]
        )
        if not len(self.train_starts) or not len(self.eval_starts):
            raise ValueError(f"seq_len {params.seq_len} does not fit in the text's train and eval blocks")

    def _batch(self, starts: np.ndarray) -> Batch:
        windows = torch.from_numpy(self.text[starts[:, None] + np.arange(self.p.seq_len + 1)])
        inputs, targets = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
        return Batch(inputs, targets, torch.ones_like(targets, dtype=torch.bool))

    def train_batch(self, step: int, batch_size: int) -> Batch:
        rng = np.random.default_rng([self.seed, step, _SALT])
        return self._batch(self.train_starts[rng.integers(0, len(self.train_starts), size=batch_size)])

    def eval_sets(self, examples: int) -> dict[str, Batch]:
        picks = np.arange(examples) % len(self.eval_starts)  # repeats only beyond eval_capacity (warned)
        return {"": self._batch(self.eval_starts[picks])}

    def eval_capacity(self) -> int | None:
        return len(self.eval_starts)

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
