"""A Sudoku constraint solver for sizes 4 (2x2 boxes), 6 (2x3 boxes) and 9 (3x3 boxes), and the puzzle generator
that the `sudoku` task builds its pools with.

Two solvers:

- **Rounds of singles** (`singles`, vectorised over many puzzles with numpy bitmasks). One *round* looks at the
  grid as it stands at the start of the round, computes every blank cell's candidates (the digits no filled cell
  of its row, column or box holds) and fills at once every cell that a single identifies:
  a *naked single* (a cell with one candidate) or a *hidden single* (a digit that has one possible cell left in
  some row, column or box). Rounds repeat until the grid is full or a round finds nothing (it *stalls*).
  The number of rounds a puzzle needs is its difficulty: round r can only use digits filled in rounds < r, so a
  solver that fills cells in dependency order needs at least that many sequential steps. Deductions by singles
  are forced, so a puzzle that singles finish has exactly one solution; one on which they stall either has
  several solutions or needs search (or stronger deductions) to finish.
- **Backtracking** (`solve`), on the most constrained cell, counting solutions up to a limit: the uniqueness
  certificate (`count_solutions(..., limit=2) == 1`) and the fallback for what singles cannot finish.

The generator (`random_grids`, `carve`) draws full grids by randomised filling on the most constrained cell
(vectorised, restarting dead ends), then removes cells in random order, keeping a removal only while the
puzzle stays in the class asked for (unique; or finished by singles within a number of rounds), until the
asked number of givens remains.

Pure numpy and the standard library.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import numpy as np

BLANK = 0
BOX_SHAPES = {4: (2, 2), 6: (2, 3), 9: (3, 3)}  # size -> (rows, columns) of a box
STALLED = -1  # `singles` rounds of a puzzle that singles do not finish (within the round cap)
CONTRADICTION = -2  # `singles` rounds of a puzzle whose givens (or forced deductions) clash: no solution


@dataclass(frozen=True)
class Geometry:
    size: int
    box_rows: int
    box_cols: int
    row_of: np.ndarray  # (n,) row index of each cell
    col_of: np.ndarray
    box_of: np.ndarray
    units: tuple[np.ndarray, np.ndarray, np.ndarray]  # rows, columns, boxes: (size, size) cell indices each

    @property
    def cells(self) -> int:
        return self.size * self.size


@functools.cache
def geometry(size: int) -> Geometry:
    if size not in BOX_SHAPES:
        raise ValueError(f"size must be one of {sorted(BOX_SHAPES)}, got {size}")
    br, bc = BOX_SHAPES[size]
    cells = np.arange(size * size)
    row_of, col_of = cells // size, cells % size
    box_of = (row_of // br) * (size // bc) + col_of // bc
    units = tuple(np.stack([cells[key == u] for u in range(size)]) for key in (row_of, col_of, box_of))
    return Geometry(size, br, bc, row_of, col_of, box_of, units)  # type: ignore[arg-type]


# bitmask lookup tables, for masks of up to 9 digits
_POP = np.array([bin(m).count("1") for m in range(512)], dtype=np.int8)
_BIT = np.array([0] + [1 << d for d in range(9)], dtype=np.int16)  # digit -> bit (0 -> 0)
_DIGIT = np.zeros(512, dtype=np.int8)  # single-bit mask -> digit
for _d in range(9):
    _DIGIT[1 << _d] = _d + 1
_NTH = np.zeros((512, 9), dtype=np.int8)  # (mask, j) -> the digit of the j-th set bit
for _m in range(512):
    for _j, _d in enumerate(d for d in range(9) if _m >> d & 1):
        _NTH[_m, _j] = _d + 1


# --- scalar backtracking: counting solutions --------------------------------------------------------------


def solve(cells, size: int, limit: int = 2, rng: random.Random | None = None) -> list[list[int]]:
    """Up to `limit` solutions of a puzzle (0 = blank), by backtracking on the most constrained cell.

    With `rng`, digits are tried in random order (to draw random full grids)."""
    g = geometry(size)
    R, C, B = g.row_of.tolist(), g.col_of.tolist(), g.box_of.tolist()
    full = (1 << size) - 1
    rm, cm, bm = [0] * size, [0] * size, [0] * size
    empty = []
    cells = [int(v) for v in cells]
    for i, v in enumerate(cells):
        if v:
            bit = 1 << (v - 1)
            if (rm[R[i]] | cm[C[i]] | bm[B[i]]) & bit:
                return []  # the givens already clash
            rm[R[i]] |= bit
            cm[C[i]] |= bit
            bm[B[i]] |= bit
        else:
            empty.append(i)
    grid = list(cells)
    found: list[list[int]] = []

    def search() -> bool:  # True: stop (limit reached)
        best, best_free, best_n = -1, 0, size + 1
        for i in empty:
            if grid[i] == 0:
                free = full & ~(rm[R[i]] | cm[C[i]] | bm[B[i]])
                if free == 0:
                    return False
                n = free.bit_count()
                if n < best_n:
                    best, best_free, best_n = i, free, n
                    if n == 1:
                        break
        if best < 0:
            found.append(list(grid))
            return len(found) >= limit
        r, c, b = R[best], C[best], B[best]
        digits = [d for d in range(size) if best_free >> d & 1]
        if rng is not None:
            rng.shuffle(digits)
        for d in digits:
            bit = 1 << d
            grid[best] = d + 1
            rm[r] |= bit
            cm[c] |= bit
            bm[b] |= bit
            stop = search()
            rm[r] ^= bit
            cm[c] ^= bit
            bm[b] ^= bit
            if stop:
                grid[best] = 0
                return True
        grid[best] = 0
        return False

    search()
    return found


def count_solutions(cells, size: int, limit: int = 2) -> int:
    """Number of solutions, counted up to `limit` (2 certifies uniqueness: the answer is then 1)."""
    return len(solve(cells, size, limit))


def is_valid_grid(grid, size: int) -> bool:
    """Every row, column and box holds each digit once (a literal reading of the rules)."""
    flat = np.asarray(grid).reshape(-1)
    want = set(range(1, size + 1))
    return all(set(flat[unit].tolist()) == want for units in geometry(size).units for unit in units)


# --- vectorised singles ---------------------------------------------------------------------------------


def _used(bits: np.ndarray, g: Geometry) -> list[np.ndarray]:
    """Per unit type: (N, size) the digits (bitmask) the filled cells of each unit hold."""
    return [np.bitwise_or.reduce(bits[:, unit], axis=2) for unit in g.units]


def candidates(grids: np.ndarray, size: int) -> np.ndarray:
    """(N, n) int16 bitmask of the digits each blank cell can hold given the filled cells (0 on filled cells)."""
    g = geometry(size)
    grids = np.asarray(grids).reshape(-1, g.cells)
    bits = _BIT[grids]
    rows, cols, boxes = _used(bits, g)
    cand = ((1 << size) - 1) & ~(rows[:, g.row_of] | cols[:, g.col_of] | boxes[:, g.box_of])
    return np.where(grids == BLANK, cand, 0).astype(np.int16)


def _round(grids: np.ndarray, g: Geometry, solutions: np.ndarray | None):
    """One round of singles on (N, n) grids: (new grids, progress (N,) bool, contradiction (N,) bool).

    With `solutions` (known to be the puzzles' only solutions), identified cells are copied from them and
    no consistency is checked (the generator's fast path)."""
    size = g.size
    full = (1 << size) - 1
    blank = grids == BLANK
    bits = _BIT[grids]
    used = _used(bits, g)
    keys = (g.row_of, g.col_of, g.box_of)
    cand = full & ~(used[0][:, g.row_of] | used[1][:, g.col_of] | used[2][:, g.box_of])
    cand = np.where(blank, cand, 0).astype(np.int16)
    hidden = np.zeros_like(cand)
    bad = np.zeros(len(grids), dtype=bool)
    for unit, key, placed in zip(g.units, keys, used, strict=True):
        m = cand[:, unit]  # (N, size units, size cells)
        once = np.zeros(m.shape[:2], dtype=np.int16)
        twice = np.zeros_like(once)
        for j in range(size):
            twice |= once & m[:, :, j]
            once |= m[:, :, j]
        exactly = once & ~twice
        hidden |= cand & exactly[:, key]
        if solutions is None:
            bad |= ((full & ~(placed | once)) != 0).any(axis=1)  # a digit with no place left in a unit
            dup = np.add.reduce(bits[:, unit].astype(np.int32), axis=2) != placed  # a digit twice in a unit
            bad |= dup.any(axis=1)
    naked = _POP[cand] == 1
    found = (naked | (hidden != 0)) & blank
    if solutions is not None:
        return np.where(found, solutions, grids), found.any(axis=1), bad
    bad |= (blank & (cand == 0)).any(axis=1)
    bad |= (_POP[hidden] > 1).any(axis=1)  # two digits forced into one cell
    value = np.where(naked, cand, hidden)
    new = np.where(found, _DIGIT[value], grids)
    return new, found.any(axis=1), bad


def singles(puzzles: np.ndarray, size: int, max_rounds: int | None = None, solutions: np.ndarray | None = None):
    """Rounds of singles on (N, n) puzzles: (grids after the last round, rounds (N,) int).

    rounds[i] is the number of rounds that filled puzzle i (0 if it had no blank), `STALLED` if a round found
    nothing before the grid was full or `max_rounds` rounds did not finish it, `CONTRADICTION` if the givens
    or the deductions clash (no solution). The grids are what the rounds filled (at most `max_rounds` of them).
    `solutions`: the puzzles' known unique solutions (fast path: no consistency checks)."""
    g = geometry(size)
    grids = np.array(puzzles, dtype=np.int64).reshape(-1, g.cells)
    out = grids.copy()
    rounds = np.full(len(grids), STALLED, dtype=np.int64)
    active = np.arange(len(grids))
    sol = None if solutions is None else np.asarray(solutions, dtype=np.int64).reshape(-1, g.cells)
    done = ~(grids == BLANK).any(axis=1)
    rounds[done] = 0
    active = active[~done]
    r = 0
    while len(active) and (max_rounds is None or r < max_rounds):
        r += 1
        new, progress, bad = _round(out[active], g, None if sol is None else sol[active])
        out[active] = new
        full = ~(new == BLANK).any(axis=1)
        if sol is None:  # a full grid can still clash (two singles of one digit in a unit)
            _, _, clash = _round(new, g, None)
            bad |= full & clash
        rounds[active[bad]] = CONTRADICTION
        rounds[active[full & ~bad]] = r
        active = active[~bad & ~full & progress]
    return out, rounds


def classify(puzzles: np.ndarray, size: int) -> np.ndarray:
    """(N,) rounds of singles each puzzle needs; `STALLED` where singles cannot finish it (for a puzzle with one
    solution: it needs search), `CONTRADICTION` where it has no solution."""
    return singles(puzzles, size)[1]


# --- the generator ------------------------------------------------------------------------------------------


def random_grids(rng: np.random.Generator, count: int, size: int) -> np.ndarray:
    """(count, n) valid full grids, drawn in bulk. With square boxes, the boxes on the diagonal (which share no
    row or column) first get independent random permutations; then the grid is filled cell by cell, always on a
    blank cell with the fewest candidates (ties broken by a random cell order drawn per grid), with a digit drawn
    uniformly from its candidates. A grid that reaches a cell with no candidate is dropped and drawn again. Not
    uniform over all grids; every valid grid has a positive probability."""
    g = geometry(size)
    parts, have = [], 0
    while have < count:
        k = max(64, int((count - have) * 1.8))
        parts.append(_fill(rng, k, g))
        have += len(parts[-1])
    return np.concatenate(parts)[:count]


def _fill(rng: np.random.Generator, k: int, g: Geometry) -> np.ndarray:
    size, n, full = g.size, g.cells, (1 << g.size) - 1
    grids = np.zeros((k, n), dtype=np.int64)
    rows = np.arange(k)
    keys = (g.row_of, g.col_of, g.box_of)
    used = [np.zeros((k, size), dtype=np.int16) for _ in keys]
    alive = np.ones(k, dtype=bool)
    steps = n
    if g.box_rows == g.box_cols:
        per = size // g.box_rows
        for j in range(per):
            cells = g.units[2][j * per + j]
            perm = 1 + np.argsort(rng.random((k, size)), axis=1)
            grids[:, cells] = perm
            for i, c in enumerate(cells):
                for u, key in zip(used, keys, strict=True):
                    u[:, key[c]] |= _BIT[perm[:, i]]
        steps -= per * size
    prio = np.argsort(rng.random((k, n)), axis=1).astype(np.int16)  # random tie-break order
    for _ in range(steps):
        cand = full & ~(used[0][:, g.row_of] | used[1][:, g.col_of] | used[2][:, g.box_of])
        blank = grids == BLANK
        pop = _POP[cand]
        alive &= ~(blank & (pop == 0)).any(axis=1)
        cell = np.argmin(np.where(blank, pop.astype(np.int16) * 128 + prio, 32000), axis=1)
        mask = cand[rows, cell]
        pick = (rng.random(k) * np.maximum(_POP[mask], 1)).astype(np.int64)
        digit = np.where(alive, _NTH[mask, pick], 0)
        grids[rows, cell] = digit
        for u, key in zip(used, keys, strict=True):
            u[rows, key[cell]] |= _BIT[digit]
    alive &= ~(grids == BLANK).any(axis=1)
    return grids[alive]


def carve(
    rng: np.random.Generator,
    puzzles: np.ndarray,
    solutions: np.ndarray,
    givens: int,
    size: int,
    max_rounds: int | None = None,
    singles_only: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Puzzles with `givens` clues carved from `puzzles` (full grids, or puzzles) whose unique solutions are
    `solutions`: (puzzles (N, n), reached (N,) bool).

    Each puzzle's clues are removed in a random order; a removal is kept when the puzzle still has a unique
    solution (`singles_only`: when rounds of singles still finish it, within `max_rounds` rounds if given; that
    also certifies uniqueness), else the clue is put back; removal stops at `givens` clues. `reached` is False
    where the order ran out before that (the puzzle then has more clues; the caller drops it or carves on).

    Uniqueness is checked by singles first (vectorised); only a puzzle on which they stall is counted by
    backtracking (`count_solutions`), from the grid the singles left."""
    g = geometry(size)
    solutions = np.asarray(solutions, dtype=np.int64).reshape(-1, g.cells)
    puzzles = np.array(puzzles, dtype=np.int64).reshape(-1, g.cells)
    left = (puzzles != BLANK).sum(axis=1)
    order = np.argsort(rng.random(puzzles.shape), axis=1)
    rows = np.arange(len(puzzles))
    for step in range(g.cells):
        cell = order[:, step]
        active = np.flatnonzero((left > givens) & (puzzles[rows, cell] != BLANK))
        if not len(active):
            if not (left > givens).any():
                break
            continue
        trial = puzzles[active].copy()
        trial[np.arange(len(active)), cell[active]] = BLANK
        cap = max_rounds if singles_only else None
        filled, rounds = singles(trial, size, cap, solutions=solutions[active])
        ok = rounds >= 0
        if not singles_only:
            for i in np.flatnonzero(~ok):
                ok[i] = count_solutions(filled[i].tolist(), size, 2) == 1
        puzzles[active[ok]] = trial[ok]
        left[active[ok]] -= 1
    return puzzles, left == givens
