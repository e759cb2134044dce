"""Task `sudoku`: fill a Sudoku grid, encoder-style (Sapunov, *Universal Transformers Need Memory:
Depth-State Trade-offs in Adaptive Recursive Reasoning*, seed 003; 4x4 variant after the CPU-scale notes), with a
difficulty knob tied to what a solver needs (seed 000's "think harder" reading: a puzzle that needs more
sequential deduction steps should need more depth).

The model reads every cell (token 0 = blank, 1..size = digits) with bidirectional attention and predicts
every cell. Every puzzle has exactly `givens` clues and a unique solution.

**Difficulty** (`sudoku_solver.py`). A round of *singles* fills at once every blank cell that a naked single
(one candidate left) or a hidden single (the only place for a digit in a row, column or box) identifies, given
the grid at the start of the round. A puzzle's difficulty is the number of rounds it needs, or *search* when the
rounds stall before the grid is full (a unique puzzle that singles cannot finish: it needs backtracking or
stronger deductions). Round r uses digits filled in round r - 1, so a puzzle that needs r rounds asks for a chain
of r dependent steps. `min_rounds` / `max_rounds` select puzzles that need that many rounds; `search: true`
selects puzzles that singles cannot finish. Rounds are invariant under the Sudoku symmetries, so augmentation
keeps a puzzle's class. Measured (random carving, below): 4x4 at 6 givens needs 1-3 rounds and never search;
6x6 at 12 givens 2-9 rounds (mostly 3-5); 9x9 at 28 givens 4-17 (mostly 7-11) among those singles finish.

- **size 4** (2x2 boxes): all 288 solved grids are enumerated. A fixed set of `eval_grids` of them (ranked
  by a salted hash, so independent of the enumeration order) is held out: training puzzles come from the
  other grids only, so no eval solution grid is ever trained on. A puzzle is a grid drawn uniformly and a
  subset of `givens` cells drawn uniformly among those that determine the grid (rejection sampling against
  all 288 grids), drawn afresh for every batch; with `min_rounds` / `max_rounds`, puzzles outside them are
  redrawn (without them the stream is the one this task always drew). Singles finish every unique 4x4 puzzle
  within 3 rounds, so 4x4 has no `search` puzzles and asks for little depth.
- **sizes 6 (2x3 boxes) and 9 (3x3 boxes)**: fixed pools of base puzzles, `pool` for training and `eval_pool`
  for evaluation, each puzzle from its own solution grid. A base puzzle: a random full grid (`random_grids`),
  then its cells removed in random order, a removal kept only while the puzzle stays in its class (`carve`:
  finished by singles within `max_rounds` rounds, which also certifies uniqueness; with `search`, unique by
  backtracking), until `givens` clues remain; then kept if it needs at least `min_rounds` rounds (with
  `search`: if singles stall on it). With `augment` (default), each drawn puzzle gets a random symmetry:
  digit relabelling, row permutations within bands and of bands, column permutations within stacks and of
  stacks, and (9x9) transposition, as seed 003's code augments its puzzles.
- **Disjointness** (no eval puzzle's solution grid is ever a training solution grid):
  - 9x9: *up to symmetry*. Grids are split by a hash of a symmetry invariant of the solution grid (the cycle
    types of the row-pair and column-pair permutations, `grid_invariants`), 1 in 16 to eval, so no
    augmentation of a train puzzle can equal, or even share a solution grid with, an eval puzzle, and the
    pools hold no two grids with the same invariant.
  - 6x6: *exact grids*. Under the symmetry group (2,488,320 elements; transposition is not a 6x6 symmetry)
    the 28,200,960 6x6 grids fall into only a few dozen classes (at least 12 by counting; a coarse invariant
    already tells 16 apart among 20,000 random grids), too few to split, so grids are split by a hash of the
    grid itself (1 in 16 to eval), and an augmented puzzle whose grid lands on the other side is drawn again.
    Train and eval puzzles can be symmetric images of each other's grids, never share a grid, and never
    coincide (their givens were carved independently).
- **Pools** are deterministic in (size, givens, min_rounds, max_rounds, search) and their side, built in chunks
  of 1,024 (a pool of n is a prefix of a pool of m > n; solution grids distinct across the pool), cached per
  process and on disk (`$STUDYRUNNER_CACHE_DIR`, else `$XDG_CACHE_HOME/studyrunner`, else
  `~/.cache/studyrunner`, under `sudoku/v2/`; `STUDYRUNNER_SUDOKU_CACHE=off` disables it; files are written
  atomically, so concurrent trials may race to write a chunk but never see half of one). The first use of a
  setting generates its pools on one core (CPU time, measured; docs/tasks.md has the table): 6x6 about 0.2-0.3
  ms per training puzzle (the default 100,000: ~25 s), 9x9 finished by singles ~1.1 ms (100,000: ~2 min), 9x9
  `search` ~11 ms (the default 16,384: ~3 min); eval puzzles cost 4-5x more each (15 of 16 grids drawn for
  them belong to training). A cached 100,000 pool loads in under a second. A batch is then a gather plus a
  symmetry: ~0.5 ms of CPU for 64 puzzles (6x6, with the redraw across the split), ~0.35 ms (9x9).
- A setting whose class the generator cannot reach (say 6x6 with 30 givens and `min_rounds: 5`) is refused at
  validation, by a small fixed probe of the generator (`probe_class`, under a second); generation itself gives
  up, naming the share, if under 1% of carved grids land in the class.

Reading chosen where the sources differ: the loss covers the **blank cells only** (this project's brief);
seed 003's code and the CPU notes put the loss on every cell, givens included: `loss_on_givens: true`.
Either way `accuracy` is per blank cell and `exact_match` is per grid, counting a grid solved when every
blank cell is right (the givens are known, so the model's copy of them is not scored).

**Levels.** The heuristic floor is "guess among the digits the givens allow": per blank cell, a uniform guess
among the digits that no given of its row, column or box holds, with no deduction from one blank to another.
It reads the input and does none of the task's computation (a cell the givens pin down is a naked single of
round 1 and counts as right). A solver limited to k rounds of singles is not a floor: it does the task's
computation, k steps of it, and is what a model of limited depth is expected to match; `difficulty_profile`
gives how many eval puzzles need each number of rounds, and `singles_ladder` the score of k rounds then
guessing, so a study can read a model's score against the depth it implies.
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from ..params import StrictParams
from .base import Batch, Task, TaskFacts
from .holdout import VALIDATION, is_eval, row_hash
from .registry import register_task
from .sudoku_solver import (
    BLANK,
    CONTRADICTION,
    STALLED,
    candidates,
    carve,
    classify,
    count_solutions,
    geometry,
    is_valid_grid,
    random_grids,
    singles,
    solve,
)

__all__ = [
    "BLANK",
    "Sudoku",
    "SudokuParams",
    "all_grids_4",
    "augment",
    "classify",
    "count_solutions",
    "difficulty_counts",
    "given_candidates",
    "grid_invariant",
    "grid_invariants",
    "is_valid_grid",
    "puzzle_pool",
    "singles",
    "solve",
]

SIZES = (4, 6, 9)
DEFAULT_GIVENS = {4: 6, 6: 12, 9: 30}
MIN_GIVENS = {4: 4, 6: 9, 9: 24}
WHY_MIN_GIVENS = {
    4: "no unique 4x4 puzzle has fewer than 4 clues",
    6: "random removal reaches fewer than 9 clues in under 1% of grids",
    9: "random removal rarely reaches fewer than 24 clues, so generation would not finish in bounded time",
}
MAX_ROUNDS_4 = 3  # singles finish every unique 4x4 puzzle within 3 rounds
DEFAULT_POOL = 100_000
DEFAULT_POOL_SEARCH = 16_384  # 9x9 search puzzles cost ~11 ms of CPU each (backtracking), the others ~1 ms
DEFAULT_EVAL_POOL = 4_096
DEFAULT_EVAL_POOL_SEARCH = 2_048
LEGACY_POOLS = (256, 64)  # what size 4 records for the (unused) pool sizes, as it always has
MAX_POOL = 1 << 20
CHUNK = 1024  # pools are built and cached in chunks of this many puzzles
MIN_ACCEPT = 1 / 100  # below this share of carved grids kept, a class is refused as too costly
_SPLIT_SALT = 0x5D0C
_POOL_SALT = 0x5D0D
CACHE_VERSION = "v2"  # bump when the generator changes: cached pools of another version are ignored


class SudokuParams(StrictParams):
    size: int = Field(4, description="Grid side: 4 (2x2 boxes), 6 (2x3 boxes) or 9 (3x3 boxes).")
    givens: int | None = Field(
        None,
        description="Clues per puzzle (exactly). Default 6 for size 4, 12 for size 6, 30 for size 9; "
        "4..15, 9..35 or 24..80.",
    )
    min_rounds: int | None = Field(
        None,
        ge=1,
        le=40,
        description="Only puzzles that need at least this many rounds of singles (a round fills every cell a "
        "naked or hidden single identifies in the grid as it stands; round r builds on round r-1). Unset: 1.",
    )
    max_rounds: int | None = Field(
        None,
        ge=1,
        le=40,
        description="Only puzzles that rounds of singles finish within this many rounds. Unset: no cap "
        "(every unique 4x4 puzzle needs at most 3).",
    )
    search: bool = Field(
        False,
        description="Only puzzles that rounds of singles cannot finish (unique, but singles stall: backtracking "
        "or stronger deductions needed). False: only puzzles singles finish. Size 9 only (singles finish every "
        "4x4 puzzle and nearly every carved 6x6 one).",
    )
    augment: bool = Field(
        True,
        description="Sizes 6 and 9: give each drawn puzzle a random Sudoku symmetry (relabelling, row/column "
        "permutations within and of bands/stacks, 9x9 transposition); the class of a puzzle is kept.",
    )
    eval_grids: int = Field(48, ge=1, le=144, description="size 4: solved grids (of 288) held out for evaluation.")
    pool: int | None = Field(
        None,
        ge=1,
        le=MAX_POOL,
        description="Sizes 6 and 9: base training puzzles, each from its own solution grid, generated once per "
        f"setting and cached. Default {DEFAULT_POOL:,} ({DEFAULT_POOL_SEARCH:,} with search). Unused at size 4.",
    )
    eval_pool: int | None = Field(
        None,
        ge=1,
        le=MAX_POOL,
        description=f"Sizes 6 and 9: base eval puzzles, generated once. Default {DEFAULT_EVAL_POOL:,} "
        f"({DEFAULT_EVAL_POOL_SEARCH:,} with search). Unused at size 4.",
    )
    loss_on_givens: bool = Field(False, description="Also put the loss on the given cells (seed 003's code).")

    # Fields added after studies were run, left out of dumps (so of resolved configs and cell hashes) while at
    # their default: a study that does not use them keeps its cell_hash and trial keys.
    omit_at_default: ClassVar[tuple[str, ...]] = ("min_rounds", "max_rounds", "search", "augment")

    @model_serializer(mode="wrap")
    def _omit_new_knobs_at_default(self, handler: SerializerFunctionWrapHandler):
        data = handler(self)
        if isinstance(data, dict):
            for name in self.omit_at_default:
                if name in data and getattr(self, name) == type(self).model_fields[name].default:
                    del data[name]
        return data

    @model_validator(mode="after")
    def _check(self) -> SudokuParams:
        if self.size not in SIZES:
            raise ValueError(f"size must be 4 or 9, or 6 (2x3 boxes), got {self.size}")
        if self.givens is None:
            self.givens = DEFAULT_GIVENS[self.size]
        low, high = MIN_GIVENS[self.size], self.size * self.size - 1
        if not low <= self.givens <= high:
            why = WHY_MIN_GIVENS[self.size]
            raise ValueError(
                f"givens for size {self.size} must be between {low} and {high} (at least one blank; {why}), "
                f"got {self.givens}"
            )
        if self.min_rounds is not None and self.max_rounds is not None and self.min_rounds > self.max_rounds:
            raise ValueError(f"min_rounds ({self.min_rounds}) must not exceed max_rounds ({self.max_rounds})")
        if self.search:
            if self.size != 9:
                raise ValueError(
                    f"search: true needs size 9: singles finish every unique 4x4 puzzle, and random carving "
                    f"yields a 6x6 puzzle they cannot finish once in 20-70 grids (50-200 ms each), got size "
                    f"{self.size}"
                )
            if self.min_rounds is not None or self.max_rounds is not None:
                raise ValueError("search: true selects puzzles singles cannot finish; min_rounds and max_rounds "
                                 "count the rounds of puzzles they do finish: leave them unset")  # fmt: skip
        if self.size == 4 and (self.min_rounds or 1) > MAX_ROUNDS_4:
            raise ValueError(f"min_rounds for size 4 must be at most {MAX_ROUNDS_4}: singles finish every unique "
                             f"4x4 puzzle within {MAX_ROUNDS_4} rounds, got {self.min_rounds}")  # fmt: skip
        if self.min_rounds is not None or self.max_rounds is not None or self.search:
            share, tried = probe_class(self.size, self.givens, self.difficulty())
            if share == 0:
                raise ValueError(
                    f"no puzzle with {self.givens} givens is in the class asked for ({_describe(self.difficulty())}) "
                    f"among {tried} a fixed probe of the generator drew (it gives up below {MIN_ACCEPT:.0%}): ask for "
                    "more givens, fewer rounds (min_rounds) or a looser max_rounds"
                )
        if self.size == 4:
            self.pool = self.pool or LEGACY_POOLS[0]
            self.eval_pool = self.eval_pool or LEGACY_POOLS[1]
        else:
            self.pool = self.pool or (DEFAULT_POOL_SEARCH if self.search else DEFAULT_POOL)
            self.eval_pool = self.eval_pool or (DEFAULT_EVAL_POOL_SEARCH if self.search else DEFAULT_EVAL_POOL)
        return self

    def difficulty(self) -> tuple[int, int | None, bool]:
        """(min rounds, max rounds or None, search): the class of puzzles drawn."""
        return (self.min_rounds or 1, self.max_rounds, self.search)


# --- the difficulty of puzzles ---------------------------------------------------------------------


def difficulty_counts(puzzles: np.ndarray, size: int) -> dict[str, int]:
    """{"1": puzzles needing 1 round of singles, "2": ..., "search": puzzles singles cannot finish} over
    (N, size*size) puzzles; "no_solution" too if any has none (never for this task's puzzles)."""
    rounds = classify(np.asarray(puzzles), size)
    out: dict[str, int] = {}
    for r in sorted(set(rounds.tolist()) - {STALLED, CONTRADICTION}):
        out[str(r)] = int((rounds == r).sum())
    out["search"] = int((rounds == STALLED).sum())
    if (rounds == CONTRADICTION).any():
        out["no_solution"] = int((rounds == CONTRADICTION).sum())
    return out


@functools.cache
def probe_class(size: int, givens: int, difficulty: tuple[int, int | None, bool]) -> tuple[float, int]:
    """(share in the class, puzzles carved) of a small fixed probe of the generator: 2,048 4x4 draws, 256 6x6 or
    64 9x9 carved grids (32 with search; under a second). A share of 0 means the class is out of reach (the
    generator gives up below 1%); `SudokuParams` refuses it at validation."""
    rng = np.random.default_rng([0x9B0B, size, givens])
    if size == 4:
        grids = all_grids_4()
        idx = rng.integers(0, len(grids), size=2048)
        cells = np.argsort(rng.random((2048, 16)), axis=1)[:, :givens]
        given = np.zeros((2048, 16), dtype=bool)
        np.put_along_axis(given, cells, True, axis=1)
        puzzles = np.where(given, grids[idx], BLANK)
        rounds = singles(puzzles, 4, solutions=grids[idx])[1]  # a puzzle singles finish is unique
        return float(in_class(rounds, difficulty).mean()), 2048
    lo, hi, search = difficulty
    count = {6: 256, 9: 32 if search else 64}[size]
    grids = random_grids(rng, count, size)
    if search:
        puzzles, reached = carve(rng, grids, grids, givens, size)
    else:
        puzzles, reached = carve(rng, grids, grids, givens, size, max_rounds=hi, singles_only=True)
    rounds = singles(puzzles, size, solutions=grids)[1]
    return float((reached & in_class(rounds, difficulty)).mean()), count


def in_class(rounds: np.ndarray, difficulty: tuple[int, int | None, bool]) -> np.ndarray:
    lo, hi, search = difficulty
    if search:
        return rounds == STALLED
    return (rounds >= lo) & ((rounds <= hi) if hi is not None else (rounds >= 0))


# --- 4x4: every grid, a fixed split ---------------------------------------------------------------


@functools.cache
def all_grids_4() -> np.ndarray:
    """The 288 solved 4x4 grids, (288, 16), in lexicographic order."""
    grids = np.array(solve([0] * 16, 4, limit=10_000), dtype=np.int64)
    order = np.lexsort(grids.T[::-1])
    return grids[order]


@functools.cache
def _grids_4(eval_grids: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grids, agreement bitmasks (288, 288), eval grid indices) for a split with `eval_grids` held out."""
    grids = all_grids_4()
    bits = 1 << np.arange(16, dtype=np.int64)
    agree = ((grids[:, None, :] == grids[None, :, :]) * bits).sum(-1)
    ranked = np.argsort(row_hash(grids, _SPLIT_SALT), kind="stable")
    return grids, agree, np.sort(ranked[:eval_grids])


def sample_4(rng: np.random.Generator, count: int, grid_ids: np.ndarray, givens: int, eval_grids: int, difficulty=None):
    """`count` unique-solution 4x4 puzzles from the listed grids: (puzzles, solutions), (count, 16) each.
    With `difficulty` (min rounds, max rounds, search), puzzles outside that class are dropped and drawn again."""
    grids, agree, _ = _grids_4(eval_grids)
    idx_parts, mask_parts, have, drawn = [], [], 0, 0
    while have < count:
        if drawn > 1000 * count + 100_000:
            raise ValueError(f"no 4x4 puzzle with {givens} givens in the class asked for among {drawn} draws")
        k = 2 * (count - have) + 16
        drawn += k
        idx = grid_ids[rng.integers(0, len(grid_ids), size=k)]
        cells = np.argsort(rng.random((k, 16)), axis=1)[:, :givens]
        subset = (1 << cells).sum(axis=1)
        # unique iff no other grid agrees with this one on every given cell
        unique = ((agree[idx] & subset[:, None]) == subset[:, None]).sum(axis=1) == 1
        if difficulty is not None:
            given = (subset[:, None] >> np.arange(16)) & 1
            rounds = singles(np.where(given == 1, grids[idx], BLANK), 4, solutions=grids[idx])[1]
            unique &= in_class(rounds, difficulty)
        idx_parts.append(idx[unique])
        mask_parts.append(subset[unique])
        have += int(unique.sum())
    idx = np.concatenate(idx_parts)[:count]
    subset = np.concatenate(mask_parts)[:count]
    solutions = grids[idx]
    given = (subset[:, None] >> np.arange(16)) & 1
    return np.where(given == 1, solutions, BLANK), solutions


# --- sizes 6 and 9: the split, symmetries, pools ---------------------------------------------------


def grid_invariants(grids: np.ndarray, size: int = 9) -> np.ndarray:
    """(N, size*(size-1)) integers that every Sudoku symmetry (relabelling, row and column permutations,
    transposition) keeps, per grid.

    For each pair of rows (r1, r2), sigma maps a column c to the column where r2 holds r1's digit at c;
    relabelling leaves sigma alone, column permutations conjugate it (keeping its cycle type), row permutations
    permute the pairs. So the sorted multiset of cycle types over row pairs, and likewise over column pairs, is
    invariant, and ordering the two halves makes it invariant under transposition too. A cycle type is coded as
    one integer (its count of cycles of each length, in base size+1)."""
    g = np.asarray(grids, dtype=np.int64).reshape(-1, size, size)
    n = len(g)
    r1, r2 = np.triu_indices(size, 1)
    ident = np.arange(size)
    weights = (size + 1) ** (size - np.arange(1, size + 1))  # a count of cycles of length L -> digit L
    halves = []
    for m in (g, g.transpose(0, 2, 1)):
        pos = np.argsort(m, axis=2)  # pos[:, r, d-1] = column of digit d in row r
        sigma = np.take_along_axis(pos[:, r2], m[:, r1] - 1, axis=2)  # (n, pairs, size)
        length = np.zeros_like(sigma)
        cur = sigma
        for k in range(1, size + 1):
            length = np.where((length == 0) & (cur == ident), k, length)
            cur = np.take_along_axis(sigma, cur, axis=2)
        # number of cycles of length L = (elements on such cycles) / L
        counts = np.stack([(length == L).sum(axis=2) // L for L in range(1, size + 1)], axis=2)
        halves.append(np.sort((counts * weights).sum(axis=2), axis=1))
    a, b = halves
    diff = a != b
    first = np.argmax(diff, axis=1)
    a_first = ~diff.any(axis=1) | (a[np.arange(n), first] < b[np.arange(n), first])
    lo = np.where(a_first[:, None], a, b)
    hi = np.where(a_first[:, None], b, a)
    return np.concatenate([lo, hi], axis=1)


def grid_invariant(grid: np.ndarray, size: int = 9) -> np.ndarray:
    """The invariant of one grid (`grid_invariants`)."""
    return grid_invariants(np.asarray(grid)[None], size)[0]


def split_keys(grids: np.ndarray, size: int) -> np.ndarray:
    """The rows the train/eval split and the pools' distinctness are decided on: the symmetry invariant (9x9),
    the grid itself (6x6)."""
    return grid_invariants(grids, size) if size == 9 else np.asarray(grids, dtype=np.int64)


def eval_side(grids: np.ndarray, size: int) -> np.ndarray:
    """(N,) True where a solution grid is on the eval side of the split."""
    return is_eval(split_keys(grids, size), _SPLIT_SALT)


def is_eval_grid(grid: np.ndarray, size: int = 9) -> bool:
    return bool(eval_side(np.asarray(grid)[None], size)[0])


def random_symmetries(rng: np.random.Generator, count: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per example: a row permutation (of bands and of rows within each band), a column permutation (of stacks
    and of columns within each), a digit map (blank kept)."""
    g = geometry(size)

    def line_perms(width: int) -> np.ndarray:  # width: lines per band (or stack)
        groups = size // width
        order = np.argsort(rng.random((count, groups)), axis=1)  # which band goes where
        within = np.argsort(rng.random((count, groups, width)), axis=2)  # line order inside each band
        return (order[:, :, None] * width + within).reshape(count, size)

    digits = np.concatenate([np.zeros((count, 1), np.int64), 1 + np.argsort(rng.random((count, size)), axis=1)], 1)
    return line_perms(g.box_rows), line_perms(g.box_cols), digits


def augment(rng: np.random.Generator, puzzles: np.ndarray, solutions: np.ndarray, size: int):
    """Apply a random symmetry (and, for square boxes, a transposition with probability 1/2) to each
    (puzzle, solution)."""
    count = len(puzzles)
    rows, cols, digits = random_symmetries(rng, count, size)
    g = geometry(size)
    flip = rng.random(count) < 0.5 if g.box_rows == g.box_cols else np.zeros(count, dtype=bool)
    out = []
    for grids in (puzzles, solutions):
        x = np.asarray(grids).reshape(count, size, size)
        x = np.where(flip[:, None, None], x.transpose(0, 2, 1), x)
        x = x[np.arange(count)[:, None, None], rows[:, :, None], cols[:, None, :]]
        x = np.take_along_axis(digits, x.reshape(count, -1), axis=1)  # digit 0 (blank) maps to 0
        out.append(x)
    return out[0], out[1]


def cache_root() -> Path | None:
    """Where pools are cached on disk: $STUDYRUNNER_CACHE_DIR, else $XDG_CACHE_HOME/studyrunner, else
    ~/.cache/studyrunner (the convention of the other tasks' caches); None (no disk cache) where
    $STUDYRUNNER_SUDOKU_CACHE is off."""
    if os.environ.get("STUDYRUNNER_SUDOKU_CACHE", "").strip().lower() in ("off", "0", "false", "no"):
        return None
    explicit = os.environ.get("STUDYRUNNER_CACHE_DIR", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "studyrunner"


def _pool_dir(size: int, givens: int, difficulty, want_eval: bool, chunk: int) -> Path | None:
    root = cache_root()
    if root is None:
        return None
    lo, hi, search = difficulty
    kind = "search" if search else f"r{lo}-{hi or 'any'}"
    name = f"{size}x{size}-g{givens}-{kind}-{'eval' if want_eval else 'train'}-c{chunk}"
    return root / "sudoku" / CACHE_VERSION / name


def _load_chunk(path: Path, n: int, chunk: int) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        data = np.load(path)
    except (OSError, ValueError, EOFError):
        return None
    if data.ndim != 3 or data.shape[0] != 2 or data.shape[1] != chunk or data.shape[2] != n:
        return None
    return data[0].astype(np.int64), data[1].astype(np.int64)


def _save_chunk(path: Path, puzzles: np.ndarray, solutions: np.ndarray) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.stack([puzzles, solutions]).astype(np.int8))
        os.replace(tmp, path)  # atomic: a reader sees the whole file or none
    except OSError:
        pass  # a read-only or full disk: the pool is still made, just not kept


def generate_chunk(size: int, givens: int, difficulty, want_eval: bool, index: int, chunk: int = CHUNK):
    """Chunk `index` of a pool: (puzzles, solutions, split keys), `chunk` of each, deterministic in the arguments.
    Solution grids are on the asked side of the split and distinct within the chunk."""
    lo, hi, search = difficulty
    rng = np.random.default_rng([_POOL_SALT, size, givens, lo, hi or 0, int(search), int(want_eval), index])
    per_try = min({6: 1024, 9: 256}[size], 2 * chunk)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    seen: set[bytes] = set()
    have = tried = 0
    while have < chunk:
        grids = random_grids(rng, per_try * (16 if want_eval else 1), size)
        side = eval_side(grids, size) == want_eval
        grids = grids[side][:per_try]
        if search:
            puzzles, reached = carve(rng, grids, grids, givens, size)
        else:
            puzzles, reached = carve(rng, grids, grids, givens, size, max_rounds=hi, singles_only=True)
        rounds = singles(puzzles, size, solutions=grids)[1]
        keep = reached & in_class(rounds, difficulty)
        keys = split_keys(grids[keep], size)
        fresh = _first_seen(keys, seen)
        parts.append((puzzles[keep][fresh], grids[keep][fresh], keys[fresh]))
        have += int(fresh.sum())
        tried += len(grids)
        if tried >= 4 * per_try and have < MIN_ACCEPT * tried:
            raise ValueError(
                f"sudoku size {size} with {givens} givens, {_describe(difficulty)}: the generator kept {have} of "
                f"{tried} carved grids (under {MIN_ACCEPT:.0%}); too costly to build a pool. Ask for more givens, "
                "fewer rounds (min_rounds), or a looser max_rounds"
            )
    return tuple(np.concatenate([p[i] for p in parts])[:chunk] for i in range(3))


def _first_seen(keys: np.ndarray, seen: set[bytes]) -> np.ndarray:
    """(N,) True for each row of `keys` not in `seen` nor earlier in `keys`; adds the new ones to `seen`."""
    fresh = np.zeros(len(keys), dtype=bool)
    for i, key in enumerate(np.ascontiguousarray(keys, dtype=np.int64)):
        b = key.tobytes()
        if b not in seen:
            seen.add(b)
            fresh[i] = True
    return fresh


def _describe(difficulty) -> str:
    lo, hi, search = difficulty
    if search:
        return "puzzles singles cannot finish"
    return f"puzzles singles finish in {lo}..{hi if hi is not None else 'any'} rounds"


_POOL_LOCK = threading.Lock()


@functools.lru_cache(maxsize=8)
def _pool(
    size: int, givens: int, difficulty, count: int, want_eval: bool, chunk: int, root
) -> tuple[np.ndarray, np.ndarray]:
    n = size * size
    folder = _pool_dir(size, givens, difficulty, want_eval, chunk)
    puzzles, solutions, keys_seen = [], [], set()
    have, index = 0, 0
    while have < count:
        path = folder / f"chunk_{index:05d}.npy" if folder is not None else None
        loaded = _load_chunk(path, n, chunk) if path is not None and path.exists() else None
        if loaded is None:
            p, s, _ = generate_chunk(size, givens, difficulty, want_eval, index, chunk)
            if path is not None:
                _save_chunk(path, p, s)
        else:
            p, s = loaded
        fresh = _first_seen(split_keys(s, size), keys_seen)  # distinct across chunks
        puzzles.append(p[fresh])
        solutions.append(s[fresh])
        have += int(fresh.sum())
        index += 1
    return np.concatenate(puzzles)[:count], np.concatenate(solutions)[:count]


def puzzle_pool(
    size: int, givens: int, count: int, want_eval: bool, difficulty: tuple[int, int | None, bool] = (1, None, False)
) -> tuple[np.ndarray, np.ndarray]:
    """`count` base (puzzles, solutions) of sizes 6 or 9, each from its own solution grid (distinct up to
    symmetry for 9x9, distinct for 6x6), all on one side of the split; deterministic in the arguments (a pool
    of n is a prefix of a pool of m > n); cached in-process and on disk (`cache_root`)."""
    with _POOL_LOCK:
        return _pool(size, givens, tuple(difficulty), count, want_eval, CHUNK, cache_root())


# --- the task -------------------------------------------------------------------------------------


def given_candidates(puzzles: np.ndarray, size: int) -> np.ndarray:
    """(count, size*size) how many digits each cell can hold given only the givens of its row, column and box
    (the givens themselves: 1)."""
    puzzles = np.asarray(puzzles).reshape(-1, size * size)
    pop = np.array([bin(m).count("1") for m in range(1 << size)])
    return np.where(puzzles != BLANK, 1, pop[candidates(puzzles, size)])


def guess_scores(hit: np.ndarray, blank: np.ndarray) -> tuple[float, float]:
    """(expected blank-cell accuracy, expected exact match) of per-cell hit probabilities `hit` (N, n)."""
    accuracy = float(hit[blank].mean()) if blank.any() else float("nan")
    exact = float(np.prod(np.where(blank, hit, 1.0), axis=1).mean())
    return accuracy, exact


class Sudoku(Task):
    metric_kinds = ("accuracy", "exact_match")

    def __init__(self, params: SudokuParams, seed: int):
        self.p, self.seed = params, seed
        self.answer_choices = params.size
        n = params.size * params.size
        self.facts = TaskFacts(vocab_size=params.size + 1, seq_len=n, causal=False)
        self.difficulty = params.difficulty()
        if params.size == 4:
            _, _, eval_ids = _grids_4(params.eval_grids)
            self.eval_ids = eval_ids
            self.train_ids = np.setdiff1d(np.arange(288), eval_ids)

    def _batch(self, puzzles: np.ndarray, solutions: np.ndarray) -> Batch:
        inputs = torch.from_numpy(np.ascontiguousarray(puzzles, dtype=np.int64))
        targets = torch.from_numpy(np.ascontiguousarray(solutions, dtype=np.int64))
        if self.p.loss_on_givens:
            mask = torch.ones_like(inputs, dtype=torch.bool)
        else:
            mask = inputs == BLANK
        return Batch(inputs, targets, mask)

    def pool(self, want_eval: bool) -> tuple[np.ndarray, np.ndarray]:
        """The base (puzzles, solutions) of sizes 6 and 9 (generated, or loaded from the cache, on first use)."""
        p = self.p
        count = p.eval_pool if want_eval else p.pool
        return puzzle_pool(p.size, p.givens, count, want_eval, self.difficulty)

    def _draw(self, rng: np.random.Generator, count: int, want_eval: bool, distinct: bool = False) -> Batch:
        p = self.p
        if p.size == 4:
            ids = self.eval_ids if want_eval else self.train_ids
            filtered = p.min_rounds is not None or p.max_rounds is not None
            return self._batch(
                *sample_4(rng, count, ids, p.givens, p.eval_grids, self.difficulty if filtered else None)
            )
        puzzles, solutions = self.pool(want_eval)
        if distinct and count <= len(puzzles):  # an eval set: distinct base puzzles
            first = rng.permutation(len(puzzles))[:count]
        else:
            first = rng.integers(0, len(puzzles), size=count)
        return self._pooled(rng, first, want_eval)

    def _pooled(self, rng: np.random.Generator, first: np.ndarray, want_eval: bool) -> Batch:
        """The pool's puzzles `first`, each under a random symmetry (`augment`) drawn from `rng`."""
        p = self.p
        puzzles, solutions = self.pool(want_eval)
        if not p.augment:
            return self._batch(puzzles[first], solutions[first])
        out_p, out_s = augment(rng, puzzles[first], solutions[first], p.size)
        if p.size == 6:  # the split is by exact grid: redraw a symmetry that moved the grid across it
            wrong = eval_side(out_s, 6) != want_eval
            while wrong.any():
                idx = np.flatnonzero(wrong)
                out_p[idx], out_s[idx] = augment(rng, puzzles[first[idx]], solutions[first[idx]], 6)
                wrong[idx] = eval_side(out_s[idx], 6) != want_eval
        return self._batch(out_p, out_s)

    def train_batch(self, step: int, batch_size: int) -> Batch:
        return self._draw(np.random.default_rng([self.seed, step, 0x5D]), batch_size, want_eval=False)

    def eval_sets(self, examples: int) -> dict[str, Batch]:
        p = self.p
        if p.size == 4:  # the stream this task always drew (a difficulty filter joins the key only when set)
            key = [0xE7A1, p.size, p.givens, p.eval_grids, p.eval_pool]
            if p.min_rounds is not None or p.max_rounds is not None:
                key += [p.min_rounds or 1, p.max_rounds or 0]
            return {"": self._draw(np.random.default_rng(key), examples, want_eval=True)}
        lo, hi, search = self.difficulty
        rng = np.random.default_rng([0xE7A2, p.size, p.givens, lo, hi or 0, int(search), p.eval_pool, int(p.augment)])
        return {"": self._draw(rng, examples, want_eval=True, distinct=True)}

    def validation_sets(self, examples: int) -> dict[str, Batch]:
        """Eval puzzles apart from the test set's: 6x6 and 9x9, the next `examples` base puzzles of the eval pool
        in the test set's own order (so none is a test puzzle's base); 4x4, puzzles drawn from the eval grids
        with another key, any that is a test puzzle drawn again."""
        p = self.p
        if p.size != 4:
            lo, hi, search = self.difficulty
            key = [p.size, p.givens, lo, hi or 0, int(search), p.eval_pool, int(p.augment)]
            puzzles, _ = self.pool(True)
            if 2 * examples > len(puzzles):
                raise ValueError(
                    f"eval_pool holds {len(puzzles)} puzzles: too few for {examples} test and {examples} validation "
                    "examples apart; raise eval_pool or lower eval.examples"
                )
            order = np.random.default_rng([0xE7A2, *key]).permutation(len(puzzles))
            return {"": self._pooled(np.random.default_rng([VALIDATION, *key]), order[examples : 2 * examples], True)}
        test = {tuple(row) for row in self.eval_sets(examples)[""].inputs.tolist()}
        rng = np.random.default_rng([VALIDATION, p.size, p.givens, p.eval_grids, p.eval_pool])
        kept_inputs, kept_targets = [], []
        for _ in range(1000):
            batch = self._draw(rng, examples, want_eval=True)
            for x, y in zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True):
                if tuple(x) not in test and len(kept_inputs) < examples:
                    kept_inputs.append(x)
                    kept_targets.append(y)
            if len(kept_inputs) >= examples:
                return {"": self._batch(np.array(kept_inputs), np.array(kept_targets))}
        raise ValueError("too few 4x4 puzzles apart from the test set for a validation split; lower eval.examples")

    def scored_positions(self, batch: Batch) -> torch.Tensor:
        return batch.inputs == BLANK  # `metrics` scores the blank cells

    def heuristic_floors(self, batch: Batch) -> dict[str, tuple[float, str]]:
        """Guess among what the givens allow: each blank cell filled with a digit drawn uniformly from those no
        given in its row, column or box excludes (a cell they pin down is then right), with no deduction
        between blanks. Its expected score per blank cell and per grid on the eval set."""
        candidates_ = given_candidates(batch.inputs.numpy(), self.p.size)
        blank = batch.inputs.numpy() == BLANK
        hit = np.where(blank, 1.0 / np.maximum(candidates_, 1), 1.0)
        accuracy, exact = guess_scores(hit, blank)
        pinned = float((candidates_[blank] == 1).mean()) if blank.any() else 0.0
        strategy = f"guess among the digits the givens allow ({pinned:.1%} of blank cells pinned down by them)"
        return {"accuracy": (accuracy, strategy), "exact_match": (exact, strategy)}

    def difficulty_profile(self, examples: int) -> dict[str, int]:
        """How many of the first `examples` eval puzzles need each number of rounds of singles ("1", "2", ...)
        and how many singles cannot finish ("search"), for `studyrunner tasks` to show."""
        return difficulty_counts(self.eval_sets(examples)[""].inputs.numpy(), self.p.size)

    def singles_ladder(self, examples: int, rounds: int | None = None) -> dict[int, dict[str, float]]:
        """{k: {"accuracy", "exact_match", "solved"}} of a solver that applies k rounds of singles and then
        guesses among each blank cell's remaining candidates, for k = 0 .. `rounds` (default: the most any eval
        puzzle needs), on the eval set of `examples`: expected scores, and the share of puzzles k rounds finish.
        k = 0 is the heuristic floor; the last k scores 1.0 on every puzzle singles finish. The scores a model of
        limited depth may be expected to match, not floors (module docstring)."""
        batch = self.eval_sets(examples)[""]
        puzzles = batch.inputs.numpy()
        blank = puzzles == BLANK
        size = self.p.size
        need = classify(puzzles, size)
        top = rounds if rounds is not None else int(max(need.max(), 1))
        pop = np.array([bin(m).count("1") for m in range(1 << size)])
        out = {}
        for k in range(top + 1):
            grids = singles(puzzles, size, max_rounds=k, solutions=batch.targets.numpy())[0] if k else puzzles
            left = pop[candidates(grids, size)]
            hit = np.where(grids != BLANK, 1.0, 1.0 / np.maximum(left, 1))
            accuracy, exact = guess_scores(hit, blank)
            out[k] = {"accuracy": accuracy, "exact_match": exact, "solved": float((grids != BLANK).all(axis=1).mean())}
        return out

    def overlap(self, examples: int) -> dict[str, dict]:
        """The exact train/eval overlap (`tasks/overlap.py`): the share of eval examples whose solution grid the
        training stream of any seed can draw (an example can only recur with its grid, so this bounds the
        overlap of token sequences). 4x4: eval grids against the training grids; 6x6 and 9x9: eval grids on the
        training side of the split (training pools are built on their side; 9x9 augmentation keeps the split
        key, 6x6 redraws a symmetry that crosses it)."""
        batch = self.eval_sets(examples)[""]
        solutions = batch.targets.numpy()
        if self.p.size == 4:
            train = {row.tobytes() for row in all_grids_4()[self.train_ids]}
            seen = sum(row.tobytes() in train for row in np.ascontiguousarray(solutions, dtype=np.int64))
            method = f"exact: eval solution grids against the {len(train)} training grids (of 288)"
        else:
            seen = int((~eval_side(solutions, self.p.size)).sum())
            key = "symmetry invariant of the solution grid" if self.p.size == 9 else "solution grid"
            method = (f"exact: every eval puzzle's {key} is on the held-out side of the fixed hash split (1 in 16), "
                      "which the training pools and stream of every seed avoid")  # fmt: skip
        return {"": {"share": seen / max(1, len(solutions)), "seen": int(seen), "examples": len(solutions),
                     "method": method}}  # fmt: skip

    def eval_capacity(self) -> int | None:
        if self.p.size == 4 and self.p.givens >= 13:  # every 13+-clue 4x4 subset is unique: count them
            from math import comb

            return len(self.eval_ids) * comb(16, self.p.givens)
        if self.p.size != 4 and not self.p.augment:
            return self.p.eval_pool
        return None

    def metrics(self, logits: torch.Tensor, batch: Batch) -> dict[str, float]:
        """`accuracy` per blank cell; `exact_match` per grid (every blank cell right)."""
        blank = batch.inputs == BLANK
        correct = (logits.argmax(-1) == batch.targets) & blank
        accuracy = correct.sum().item() / max(1, blank.sum().item())
        exact = (correct | ~blank).all(dim=1).float().mean().item()
        return {"accuracy": accuracy, "exact_match": exact}


@register_task("sudoku", SudokuParams)
def build(params: SudokuParams, seed: int) -> Sudoku:
    return Sudoku(params, seed)
