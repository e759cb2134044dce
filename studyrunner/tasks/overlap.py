"""Measured train/eval overlap: the share of a task's eval examples whose exact token sequence also occurs in
its training stream.

Every task holds its eval examples out by construction (`holdout.py`: a fixed hash of the example sends 1 in 16
to evaluation and the training stream redraws those; Sudoku by solution grid; charlm by text block). This
module *measures* it, from the task's own `train_batch` and `eval_sets`, so a claim of "no leakage" rests on a
number and not on reading the generator:

- **sampled** (every task): the eval examples' input rows against `batches` training batches of `batch_size`
  at seed 0 (the training stream of seed 0, steps 0 .. batches-1). A row counts as seen when the identical
  token sequence (same length, same tokens) is among the training inputs. It is a lower bound on the overlap
  of a full run, exact where the training space is small enough that the sample covers it.
- **exact** (a task that has one): a task may define `overlap(examples) -> {split: Overlap | dict}` (or one
  answer for every split) that answers for every training batch any seed could draw (a held-out partition
  that the stream provably rejects, or a finite pool checked in full). Its figure is the headline and the
  sampled one is kept beside it; a dict needs `share` and should give `method` (and may give `seen`,
  `examples`). A method that needs more than `examples` (e.g. a window length) is not called.

Pure Python/numpy over `Task`: imports nothing from the platform.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, replace

import numpy as np

from .base import Task
from .holdout import HOLDOUT

BATCHES = 50
BATCH_SIZE = 64


@dataclass(frozen=True)
class Overlap:
    """The overlap of one eval split with the training stream."""

    share: float  # share of the eval examples whose token sequence occurs in training
    seen: int | None  # how many of them (None where a task's exact method gives only the share)
    examples: int  # eval examples checked
    method: str  # how it was measured, in words
    exact: bool  # True: over every training batch any seed can draw; False: over a sample of batches

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, value: Overlap | dict | float, examples: int) -> Overlap:
        """A task's own answer as an exact Overlap: an Overlap, a bare share, or a dict with `share` (and `method`,
        `seen`, `examples` where it has them; any other keys are named in the method)."""
        if isinstance(value, Overlap):
            return value
        if isinstance(value, int | float):
            return cls(float(value), None, examples, "exact: the task's own overlap method", True)
        extra = {k: v for k, v in value.items() if k not in ("share", "seen", "examples", "method", "exact")}
        method = value.get("method") or "exact: the task's own overlap method" + (
            f" ({', '.join(f'{k} {v}' for k, v in extra.items())})" if extra else ""
        )
        seen = value.get("seen")
        return cls(
            share=float(value["share"]),
            seen=None if seen is None else int(seen),
            examples=int(value.get("examples", value.get("windows", examples))),
            method=str(method),
            exact=bool(value.get("exact", True)),
        )


def _row_keys(inputs: np.ndarray) -> list[bytes]:
    """One hashable key per row: its length and its tokens, so rows of different lengths never match."""
    rows = np.ascontiguousarray(np.asarray(inputs, dtype="<i8"))
    return [len(row).to_bytes(4, "little") + row.tobytes() for row in rows]


def sampled_overlap(
    task: Task, examples: int = 512, batches: int = BATCHES, batch_size: int = BATCH_SIZE
) -> dict[str, Overlap]:
    """{split: the share of its eval examples whose input row occurs among `batches` training batches of
    `batch_size` (the task's seed, steps 0 .. batches-1)}."""
    train: set[bytes] = set()
    for step in range(batches):
        train.update(_row_keys(task.train_batch(step, batch_size).inputs.numpy()))
    out = {}
    for split, batch in task.eval_sets(examples).items():
        keys = _row_keys(batch.inputs.numpy())
        seen = sum(key in train for key in keys)
        distinct = len(train)
        out[split] = Overlap(
            share=seen / max(1, len(keys)),
            seen=seen,
            examples=len(keys),
            method=f"sampled: {len(keys)} eval examples against {batches} training batches x {batch_size} "
            f"(seed {getattr(task, 'seed', '?')}, steps 0-{batches - 1}; {distinct:,} distinct training sequences)",
            exact=False,
        )
    return out


def partition_overlap(task: Task, examples: int, is_eval_row, what: str) -> dict[str, Overlap]:
    """The exact overlap of a task whose training stream redraws every example on the eval side of the fixed
    partition (`holdout.draw`) and whose partition key is the token sequence itself: an eval example can occur
    in training only if its own hash sends it to training, so the overlap over every batch of every seed is the
    share of eval examples `is_eval_row` puts on the training side (0 when the partition holds)."""
    out = {}
    for split, batch in task.eval_sets(examples).items():
        rows = batch.inputs.numpy()
        seen = int((~np.asarray(is_eval_row(rows), dtype=bool)).sum())
        out[split] = Overlap(
            share=seen / max(1, len(rows)),
            seen=seen,
            examples=len(rows),
            method=f"exact: every eval {what} is on the held-out side of the fixed hash partition (1 in {HOLDOUT}), "
            "which the training stream of every seed redraws",
            exact=True,
        )
    return out


def task_overlap_method(task: Task):
    """The task's own exact `overlap(examples)`, where it has one that takes the eval size alone (a method that
    needs other arguments answers another question and is not called); else None."""
    method = getattr(task, "overlap", None)
    if not callable(method):
        return None
    try:
        inspect.signature(method).bind(examples=1)
    except (TypeError, ValueError):
        return None
    return method


def measure_overlap(
    task: Task, examples: int = 512, batches: int = BATCHES, batch_size: int = BATCH_SIZE
) -> dict[str, dict[str, Overlap]]:
    """{split: {"sampled": Overlap, "exact": Overlap (where the task has an `overlap(examples)` method)}}."""
    sampled = sampled_overlap(task, examples, batches, batch_size)
    method = task_overlap_method(task)
    own = getattr(task, "overlap", None)
    if method is None and callable(own):  # say so: a reader may expect the task's own figure here
        note = f"; the task's own overlap{inspect.signature(own)} needs more than the eval size and is not called"
        sampled = {split: replace(o, method=o.method + note) for split, o in sampled.items()}
    exact = {}
    if method is not None:
        found = method(examples=examples)
        if isinstance(found, Overlap | int | float) or (isinstance(found, dict) and "share" in found):
            found = dict.fromkeys(sampled, found)  # one answer for every split
        exact = {split: Overlap.of(v, examples) for split, v in found.items()}
    return {
        split: {"sampled": s, **({"exact": exact[split]} if split in exact else {})} for split, s in sampled.items()
    }


def headline(measured: dict[str, Overlap]) -> Overlap:
    """The figure to show for a split: the exact one where there is one, else the sampled one."""
    return measured.get("exact") or measured["sampled"]
