"""A fixed train/eval partition of a task's example space, so no eval example is ever trained on.

Every task hashes each example (a row of integers: the tokens, or the structure they encode) with a
fixed salt. Rows whose hash falls in the held-out bucket (1 in `HOLDOUT`) form the eval space; the
training stream rejects them and draws again. The partition depends on the example alone, never on
the trial seed, the step or the eval set size, so it holds for every batch ever generated.
"""

from __future__ import annotations

import hashlib

import numpy as np

HOLDOUT = 16  # one example in 16 is reserved for evaluation
# The first element of a validation set's RNG key (a test set's is 0xE7A1): both come from the held-out part.
VALIDATION = 0x7A11


def row_hash(rows: np.ndarray, salt: int) -> np.ndarray:
    """A 64-bit hash per row of a 2-D integer array: BLAKE2b of the row's little-endian int64 bytes,
    keyed by the salt (the same on every platform and Python version)."""
    rows = np.asarray(rows)
    if rows.ndim != 2:
        raise ValueError(f"row_hash expects a 2-D array, got shape {rows.shape}")
    data = np.ascontiguousarray(rows, dtype="<i8")
    key = int(salt).to_bytes(8, "little", signed=False)
    out = np.empty(len(data), dtype=np.uint64)
    for i, row in enumerate(data):
        out[i] = int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8, key=key).digest(), "little")
    return out


def is_eval(rows: np.ndarray, salt: int) -> np.ndarray:
    """True where a row belongs to the held-out (eval) part of the example space."""
    return row_hash(rows, salt) % np.uint64(HOLDOUT) == 0


def draw(sample, rng: np.random.Generator, count: int, salt: int, want_eval: bool, max_rounds: int = 10_000):
    """`count` examples from `sample(rng, k) -> (keys (k, w), *arrays)` on one side of the partition.

    Rejected rows are redrawn (in rounds sized to the expected acceptance), so the result depends only
    on `rng`'s state. Returns the tuple `(keys, *arrays)` restricted to the accepted rows.
    """
    accept_rate = 1 / HOLDOUT if want_eval else 1 - 1 / HOLDOUT
    parts: list[tuple] = []
    have = 0
    for _ in range(max_rounds):
        k = int((count - have) / accept_rate * 1.1) + 8
        out = sample(rng, k)
        keep = is_eval(out[0], salt) == want_eval
        if keep.any():
            parts.append(tuple(a[keep] for a in out))
            have += int(keep.sum())
        if have >= count:
            return tuple(np.concatenate([p[i] for p in parts])[:count] for i in range(len(parts[0])))
    side = "eval" if want_eval else "train"
    raise RuntimeError(f"could not draw {count} {side} examples in {max_rounds} rounds: the example space is too small")


def draw_apart(sample, rng: np.random.Generator, count: int, salt: int, taken: np.ndarray) -> tuple:
    """`count` held-out examples none of which is a row of `taken` (the test set's keys): a validation set from
    the same held-out part of the example space as the test set, sharing no example with it."""
    seen = {row.tobytes() for row in np.ascontiguousarray(taken, dtype="<i8")}

    def apart(r: np.random.Generator, k: int) -> tuple:
        out = sample(r, k)
        keys = np.ascontiguousarray(out[0], dtype="<i8")
        keep = np.array([row.tobytes() not in seen for row in keys], dtype=bool)
        return tuple(a[keep] for a in out)

    return draw(apart, rng, count, salt, want_eval=True)
