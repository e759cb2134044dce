"""Sudoku puzzles against the solver and a brute-force count; the held-out grids; blank-cell metrics; the rounds of
singles (against a plain reference and hand-made puzzles); 6x6 and 9x9 pools: uniqueness, class, determinism,
disjointness, size; the 4x4 stream unchanged."""

import hashlib

import numpy as np
import pytest
import torch
from pydantic import ValidationError

import studyrunner.tasks.sudoku as sudoku
from studyrunner.tasks import build_task, get_task
from studyrunner.tasks.sudoku import (
    all_grids_4,
    augment,
    count_solutions,
    eval_side,
    grid_invariant,
    grid_invariants,
    is_valid_grid,
    puzzle_pool,
    solve,
)
from studyrunner.tasks.sudoku_solver import (
    CONTRADICTION,
    STALLED,
    carve,
    classify,
    geometry,
    random_grids,
    singles,
)

pytestmark = pytest.mark.usefixtures("small_sudoku_pools")


def test_there_are_288_valid_4x4_grids():
    grids = all_grids_4()
    assert grids.shape == (288, 16) and len({tuple(g) for g in grids.tolist()}) == 288
    assert all(is_valid_grid(g, 4) for g in grids.tolist())
    assert not is_valid_grid([1, 2, 3, 4] * 4, 4)


def test_solver_counts_match_brute_force_over_all_4x4_grids():
    grids = all_grids_4()
    rng = np.random.default_rng(0)
    for _ in range(200):
        g = grids[rng.integers(288)]
        keep = rng.random(16) < rng.uniform(0.1, 0.6)
        puzzle = np.where(keep, g, 0)
        brute = int(((grids == puzzle) | (puzzle == 0)).all(axis=1).sum())
        assert count_solutions(puzzle.tolist(), 4, limit=1000) == brute
        assert count_solutions(puzzle.tolist(), 4, limit=2) == min(brute, 2)


@pytest.mark.parametrize("givens", [4, 6, 10, 15])
def test_4x4_puzzles_are_unique_with_exact_givens(givens):
    task = build_task("sudoku", {"size": 4, "givens": givens}, seed=1)
    for batch in [task.train_batch(0, 64), task.eval_sets(64)[""]]:
        for puzzle, solution in zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True):
            assert sum(v > 0 for v in puzzle) == givens
            assert all(v in (0, s) for v, s in zip(puzzle, solution, strict=True))
            assert solve(puzzle, 4, limit=2) == [solution]  # unique, and it is the target
        assert torch.equal(batch.loss_mask, batch.inputs == 0)


def test_4x4_eval_grids_never_appear_in_training():
    task = build_task("sudoku", {"size": 4, "eval_grids": 48}, seed=0)
    eval_solutions = {tuple(r) for r in task.eval_sets(1024)[""].targets.tolist()}
    train_solutions = set()
    for step in range(100):
        train_solutions |= {tuple(r) for r in task.train_batch(step, 64).targets.tolist()}
    assert len(eval_solutions) == 48 and len(train_solutions) == 240  # every train grid seen
    assert not eval_solutions & train_solutions
    assert {tuple(g) for g in all_grids_4().tolist()} == eval_solutions | train_solutions


def test_9x9_puzzles_are_unique_with_exact_givens():
    task = build_task("sudoku", {"size": 9, "givens": 40, "pool": 6, "eval_pool": 3}, seed=0)
    assert task.facts.vocab_size == 10 and task.facts.seq_len == 81 and not task.facts.causal
    for batch in [task.train_batch(3, 12), task.eval_sets(12)[""]]:
        for puzzle, solution in zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True):
            assert sum(v > 0 for v in puzzle) == 40
            assert is_valid_grid(solution, 9)
            assert solve(puzzle, 9, limit=2) == [solution]


def test_metrics_score_blank_cells_only_and_loss_follows_the_option():
    task = build_task("sudoku", {"size": 4, "givens": 6}, seed=0)
    batch = task.eval_sets(16)[""]
    logits = torch.nn.functional.one_hot(batch.targets, 5).float()
    given = batch.inputs > 0
    broken = logits.clone()
    broken[given] = torch.roll(broken[given], 1, dims=-1)  # wrong on every given: not scored
    assert task.metrics(broken, batch) == {"accuracy": 1.0, "exact_match": 1.0}
    one_blank = logits.clone()
    row, col = 0, int(torch.nonzero(~given[0])[0])
    one_blank[row, col] = torch.roll(one_blank[row, col], 1, dims=-1)
    got = task.metrics(one_blank, batch)
    assert got["exact_match"] == pytest.approx(15 / 16) and got["accuracy"] == pytest.approx(1 - 1 / (16 * 10))
    everything = build_task("sudoku", {"size": 4, "givens": 6, "loss_on_givens": True}, seed=0)
    assert everything.eval_sets(16)[""].loss_mask.all()


# --- the 4x4 stream and its recorded configs are what they were ----------------------------------------------


def _digest(batch):
    rows = torch.cat([batch.inputs, batch.targets, batch.loss_mask.long()], 1).numpy().astype(np.int64)
    return hashlib.blake2b(rows.tobytes(), digest_size=8).hexdigest()


@pytest.mark.parametrize(
    "params,digests",
    [
        ({"size": 4, "givens": 6}, ["98c45874fcdd479c", "03f77463f482d3a5", "fe90da411bf3d518"]),
        ({"size": 4, "givens": 4, "eval_grids": 20}, ["0d2c76419cd1bcdf", "2d33537d93458624", "80ce2a62b71d9151"]),
        (
            {"size": 4, "givens": 15, "loss_on_givens": True},
            ["806a47efd96b5e26", "41e96d7997d93292", "07f3be460b25bb98"],
        ),
    ],
)
def test_4x4_batches_are_the_ones_the_task_always_drew(params, digests):
    """Digests recorded from the task before difficulty was added (train steps 0 and 7 at seed 3, eval 512)."""
    task = build_task("sudoku", params, seed=3)
    got = [_digest(task.train_batch(0, 64)), _digest(task.train_batch(7, 64)), _digest(task.eval_sets(512)[""])]
    assert got == digests


def test_new_knobs_at_their_defaults_leave_recorded_configs_alone():
    """A study that does not use the new knobs keeps its resolved config, so its cell hashes and trial keys."""
    model = get_task("sudoku").params_model
    assert model.model_validate({"size": 4, "givens": 6}).model_dump() == {
        "size": 4, "givens": 6, "eval_grids": 48, "pool": 256, "eval_pool": 64, "loss_on_givens": False,
    }  # fmt: skip
    dumped = model.model_validate({"size": 6, "min_rounds": 4, "augment": False}).model_dump()
    assert dumped["min_rounds"] == 4 and dumped["augment"] is False and "search" not in dumped
    assert model.model_validate(dumped).model_dump() == dumped  # a resolved config validates to itself


@pytest.mark.parametrize(
    "bad,words",
    [
        ({"size": 5}, "4 or 9"),
        ({"size": 6, "givens": 8}, "between 9 and 35"),
        ({"size": 6, "search": True}, "needs size 9"),
        ({"size": 9, "search": True, "min_rounds": 3}, "leave them unset"),
        ({"size": 6, "min_rounds": 5, "max_rounds": 4}, "must not exceed"),
        ({"size": 4, "min_rounds": 4}, "at most 3"),
        ({"size": 6, "min_rounds": 0}, "greater than or equal to 1"),
        ({"size": 6, "givens": 30, "min_rounds": 5}, "no puzzle with 30 givens is in the class"),
        ({"size": 4, "givens": 15, "min_rounds": 2}, "no puzzle with 15 givens is in the class"),
    ],
)
def test_settings_without_puzzles_are_refused(bad, words):
    with pytest.raises(ValidationError) as err:
        get_task("sudoku").params_model.model_validate(bad)
    assert words in str(err.value)


# --- rounds of singles ------------------------------------------------------------------------------------------


def _units(size):
    br, bc = {4: (2, 2), 6: (2, 3), 9: (3, 3)}[size]
    rows = [[r * size + c for c in range(size)] for r in range(size)]
    cols = [[r * size + c for r in range(size)] for c in range(size)]
    boxes = [
        [(r0 + r) * size + c0 + c for r in range(br) for c in range(bc)]
        for r0 in range(0, size, br)
        for c0 in range(0, size, bc)
    ]
    return rows + cols + boxes


def reference_rounds(puzzle, size, max_rounds=None):
    """Rounds of singles, written plainly: (grid after, rounds | STALLED | CONTRADICTION)."""
    units = _units(size)
    peers = [set().union(*(u for u in units if i in u)) - {i} for i in range(size * size)]
    digits = set(range(1, size + 1))
    grid = list(puzzle)

    def clash():
        return any(len([grid[i] for i in u if grid[i]]) != len({grid[i] for i in u if grid[i]}) for u in units)

    if clash():
        return grid, CONTRADICTION
    rounds = 0
    while 0 in grid:
        if max_rounds is not None and rounds == max_rounds:
            return grid, STALLED
        cand = {i: digits - {grid[j] for j in peers[i]} for i in range(len(grid)) if grid[i] == 0}
        if any(not c for c in cand.values()):
            return grid, CONTRADICTION
        found = {i: set(c) for i, c in cand.items() if len(c) == 1}  # naked singles
        for u in units:
            for d in digits - {grid[i] for i in u}:
                places = [i for i in u if grid[i] == 0 and d in cand[i]]
                if not places:
                    return grid, CONTRADICTION
                if len(places) == 1:  # hidden single
                    found.setdefault(places[0], set()).add(d)
        if not found:
            return grid, STALLED
        if any(len(v) > 1 for v in found.values()):
            return grid, CONTRADICTION
        for i, v in found.items():
            grid[i] = v.pop()
        rounds += 1
        if clash():
            return grid, CONTRADICTION
    return grid, rounds


@pytest.mark.parametrize("size", [4, 6, 9])
def test_rounds_of_singles_match_a_plain_reference(size):
    rng = np.random.default_rng(size)
    grids = random_grids(rng, 60, size)
    puzzles = np.where(rng.random(grids.shape) < rng.uniform(0.25, 0.75, (60, 1)), grids, 0)
    puzzles[:5] = 0  # empty grids: many solutions, singles stall at once
    puzzles[5:10, 0] = puzzles[5:10, 1] = 1 + (grids[5:10, 1] % size)  # a clash or a wrong given in row 0
    for cap in (None, 1, 2):
        out, rounds = singles(puzzles, size, max_rounds=cap)
        for p, o, r in zip(puzzles.tolist(), out.tolist(), rounds.tolist(), strict=True):
            want_grid, want = reference_rounds(p, size, cap)
            assert r == want
            if r != CONTRADICTION:
                assert o == want_grid
    # the generator's fast path (solutions known) agrees wherever the puzzle has that solution
    fine = puzzles[10:]
    assert np.array_equal(singles(fine, size, solutions=grids[10:])[1], singles(fine, size)[1])
    assert set(classify(puzzles, size).tolist()) >= {STALLED, CONTRADICTION}


def _grid(text):
    return [0 if c == "." else int(c) for c in text.replace(" ", "").replace("|", "")]


def test_rounds_on_hand_made_puzzles():
    solved = _grid("1234 3412 2143 4321")
    assert classify(np.array([solved]), 4).tolist() == [0]
    one_blank = list(solved)
    one_blank[5] = 0
    assert classify(np.array([one_blank]), 4).tolist() == [1]
    # a hidden single that is no naked single: the 1s at (1,2) and (2,1) leave row 0 one place for a 1, (0,0),
    # whose candidates are still 1-4; likewise row 3's only place is (3,3). Nothing else is forced.
    hidden = _grid(".... ..1. .1.. ....")
    out, rounds = singles(np.array([hidden]), 4, max_rounds=1)
    assert out[0].tolist() == _grid("1... ..1. .1.. ...1") and rounds.tolist() == [STALLED]
    # two rounds. Puzzle (rows):  . . . 4 / . 4 1 . / . 1 4 . / 4 3 2 1
    # Round 1: naked singles (0,1)=2 (column 1 holds 4 1 3), (0,2)=3, (2,0)=2, (2,3)=3; hidden singles (0,0)=1 (row
    # 0's only place for a 1: columns 1 and 2 hold one) and (1,3)=2 (column 3's only place for a 2: (2,3) can only
    # hold 3). (1,0) has {2, 3} and shares both with (1,3), (0,0) and (2,0): nothing forces it until round 2,
    # when row 1 holds 4 1 2 and (1,0)=3.
    two = _grid("...4 .41. .14. 4321")
    out, rounds = singles(np.array([two]), 4, max_rounds=1)
    assert out.tolist() == [_grid("1234 .412 2143 4321")] and rounds.tolist() == [STALLED]
    assert classify(np.array([two]), 4).tolist() == [2]
    assert singles(np.array([two]), 4, max_rounds=2)[0].tolist() == [solved]
    # an empty grid has many solutions: singles stall at once; a clash has none
    assert classify(np.zeros((1, 36), np.int64), 6).tolist() == [STALLED]
    assert classify(np.array([_grid("11.. .... .... ....")]), 4).tolist() == [CONTRADICTION]
    # famous hard 9x9 puzzles (AI Escargot, and two from Norvig's essay): unique, and singles stall on them
    for text in [
        "1....7.9..3..2...8..96..5....53..9...1..8...26....4...3......1..4......7..7...3..",
        "85...24..72......9..4.........1.7..23.5...9...4...........8..7..17..........36.4.",
        "8..........36......7..9.2...5...7.......457.....1...3...1....68..85...1..9....4..",
    ]:
        puzzle = _grid(text)
        assert count_solutions(puzzle, 9) == 1 and classify(np.array([puzzle]), 9).tolist() == [STALLED]


def test_a_6x6_puzzle_with_a_known_number_of_rounds():
    """2x3 boxes: the box of (0,0) is rows 0-1, columns 0-2. Each blank below has one candidate once its
    neighbours are filled, in a chain: round 1 fills (5,5), round 2 (5,4) ... (checked by the reference too)."""
    grid = random_grids(np.random.default_rng(7), 1, 6)[0]
    assert is_valid_grid(grid, 6) and len({tuple(u) for u in geometry(6).units[2].tolist()}) == 6
    assert geometry(6).units[2][0].tolist() == [0, 1, 2, 6, 7, 8]
    for blanks in ([35], [35, 34, 33, 32, 31, 30], list(range(30, 36)) + [29, 23]):
        puzzle = grid.copy()
        puzzle[blanks] = 0
        want = reference_rounds(puzzle.tolist(), 6)[1]
        assert classify(puzzle[None], 6).tolist() == [want] and want >= 1


# --- 6x6 and 9x9: unique, in class, exact givens ----------------------------------------------------------------

SETTINGS = [
    {"size": 6, "givens": 12, "pool": 100, "eval_pool": 64},
    {"size": 6, "givens": 12, "min_rounds": 4, "max_rounds": 5, "pool": 100, "eval_pool": 64},
    {"size": 6, "givens": 16, "max_rounds": 2, "pool": 64, "eval_pool": 64, "augment": False},
    {"size": 9, "givens": 30, "max_rounds": 8, "pool": 64, "eval_pool": 32},
]


def _in_class(rounds, params):
    if params.get("search"):
        return (rounds == STALLED).all()
    lo, hi = params.get("min_rounds", 1), params.get("max_rounds", 99)
    return ((rounds >= lo) & (rounds <= hi)).all()


@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_puzzles_are_unique_with_exact_givens_and_in_their_class(params):
    task = build_task("sudoku", params, seed=1)
    size = params["size"]
    assert task.facts.vocab_size == size + 1 and task.facts.seq_len == size * size and not task.facts.causal
    for batch in [task.train_batch(0, 48), task.eval_sets(48)[""]]:
        puzzles, solutions = batch.inputs.numpy(), batch.targets.numpy()
        assert ((puzzles > 0).sum(axis=1) == params["givens"]).all()
        for p, s in zip(puzzles.tolist(), solutions.tolist(), strict=True):
            assert is_valid_grid(s, size) and solve(p, size, limit=2) == [s]  # unique, and it is the target
        assert _in_class(classify(puzzles, size), params)
        assert torch.equal(batch.loss_mask, batch.inputs == 0)


def test_9x9_search_puzzles_need_search(monkeypatch):
    monkeypatch.setattr(sudoku, "CHUNK", 8)
    params = {"size": 9, "givens": 26, "search": True, "pool": 8, "eval_pool": 8}
    task = build_task("sudoku", params, seed=0)
    for batch in [task.train_batch(0, 8), task.eval_sets(8)[""]]:
        puzzles = batch.inputs.numpy()
        assert (classify(puzzles, 9) == STALLED).all() and ((puzzles > 0).sum(axis=1) == 26).all()
        for p, s in zip(puzzles.tolist(), batch.targets.tolist(), strict=True):
            assert solve(p, 9, limit=2) == [s]
    assert task.difficulty_profile(8) == {"search": 8}


def test_carving_keeps_the_class_it_was_asked_for():
    rng = np.random.default_rng(0)
    grids = random_grids(rng, 64, 6)
    puzzles, reached = carve(rng, grids, grids, 12, 6, max_rounds=3, singles_only=True)
    rounds = classify(puzzles, 6)
    assert reached.mean() > 0.5 and ((rounds >= 1) & (rounds <= 3)).all()
    assert ((puzzles[reached] > 0).sum(axis=1) == 12).all()
    unique, reached = carve(rng, grids[:16], grids[:16], 12, 6)
    assert all(count_solutions(p.tolist(), 6) == 1 for p in unique)


@pytest.mark.parametrize("size", [6, 9])
def test_symmetries_keep_validity_uniqueness_and_rounds(size):
    p, s = puzzle_pool(size, 14 if size == 6 else 32, 40, False)
    rng = np.random.default_rng(0)
    ap, as_ = augment(rng, p, s, size)
    assert not np.array_equal(as_, s)
    assert np.array_equal(classify(ap, size), classify(p, size))  # the class survives
    for q, t in zip(ap.tolist(), as_.tolist(), strict=True):
        assert is_valid_grid(t, size) and solve(q, size, limit=2) == [t]


# --- determinism ------------------------------------------------------------------------------------------------


def test_pools_are_deterministic_prefixes_and_the_disk_cache_returns_them(monkeypatch, tmp_path):
    first = puzzle_pool(6, 12, 150, False)
    sudoku._pool.cache_clear()
    again = puzzle_pool(6, 12, 150, False)  # from the disk cache
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    files = sorted((tmp_path / "cache" / "sudoku").rglob("chunk_*.npy"))
    assert len(files) == 3  # chunks of 64
    monkeypatch.setenv("STUDYRUNNER_SUDOKU_CACHE", "off")
    sudoku._pool.cache_clear()
    fresh = puzzle_pool(6, 12, 100, False)  # generated afresh, no cache: the same puzzles, a prefix
    assert all(np.array_equal(a[:100], b) for a, b in zip(first, fresh, strict=True))
    files[0].write_bytes(b"not a pool")  # a broken cache file is regenerated
    monkeypatch.delenv("STUDYRUNNER_SUDOKU_CACHE")
    sudoku._pool.cache_clear()
    assert all(np.array_equal(a, b) for a, b in zip(first, puzzle_pool(6, 12, 150, False), strict=True))


@pytest.mark.parametrize("params", SETTINGS[:1] + SETTINGS[3:], ids=["6x6", "9x9"])
def test_batches_depend_on_seed_and_step_and_eval_sets_on_params_only(params):
    a, b, other = build_task("sudoku", params, 0), build_task("sudoku", params, 0), build_task("sudoku", params, 1)
    assert torch.equal(a.train_batch(5, 32).inputs, b.train_batch(5, 32).inputs)
    assert not torch.equal(a.train_batch(5, 32).inputs, a.train_batch(6, 32).inputs)
    assert not torch.equal(a.train_batch(5, 32).inputs, other.train_batch(5, 32).inputs)
    assert torch.equal(a.eval_sets(32)[""].inputs, other.eval_sets(32)[""].inputs)


# --- disjointness -----------------------------------------------------------------------------------------------


def test_9x9_symmetries_keep_the_invariant_so_train_and_eval_grids_never_meet():
    train_p, train_s = puzzle_pool(9, 40, 40, False)
    eval_p, eval_s = puzzle_pool(9, 40, 20, True)
    rng = np.random.default_rng(0)
    aug_p, aug_s = augment(rng, np.repeat(train_p, 4, 0), np.repeat(train_s, 4, 0), 9)
    assert not np.array_equal(aug_s, np.repeat(train_s, 4, 0))  # the augmentation does something
    assert np.array_equal(grid_invariants(aug_s), grid_invariants(np.repeat(train_s, 4, 0)))
    for p, s in zip(aug_p[:12], aug_s[:12], strict=True):
        assert is_valid_grid(s.tolist(), 9) and solve(p.tolist(), 9, limit=2) == [s.tolist()]
    train_keys = {tuple(k) for k in grid_invariants(train_s)}
    assert not train_keys & {tuple(grid_invariant(s)) for s in eval_s}
    assert len(train_keys) == len(train_s)  # the invariant tells the pool's grids apart: all distinct
    assert not eval_side(train_s, 9).any() and eval_side(eval_s, 9).all()
    # the invariant is not constant: it separates grids that are not symmetric images of each other
    other = random_grids(np.random.default_rng(1), 50, 9)
    assert len({tuple(k) for k in grid_invariants(other)}) == 50


def test_9x9_training_stream_never_meets_an_eval_grid():
    task = build_task("sudoku", {"size": 9, "givens": 32, "pool": 64, "eval_pool": 64}, seed=0)
    eval_keys = {tuple(k) for k in grid_invariants(task.eval_sets(64)[""].targets.numpy())}
    train_keys = set()
    for step in range(20):
        train_keys |= {tuple(k) for k in grid_invariants(task.train_batch(step, 32).targets.numpy())}
    assert len(train_keys) == 64 and not train_keys & eval_keys  # every base grid seen, none an eval grid
    assert task.overlap(64)[""]["share"] == 0.0


def test_6x6_split_is_by_exact_grid_and_the_stream_redraws_across_it():
    task = build_task("sudoku", {"size": 6, "givens": 12, "pool": 64, "eval_pool": 64}, seed=0)
    evals = task.eval_sets(256)[""]
    eval_grids = {row.tobytes() for row in evals.targets.numpy()}
    assert eval_side(evals.targets.numpy(), 6).all() and len(eval_grids) == 256  # augmented: distinct
    seen = set()
    for step in range(100):
        solutions = task.train_batch(step, 64).targets.numpy()
        assert not eval_side(solutions, 6).any()  # a symmetry that moved a grid to the eval side was redrawn
        seen |= {row.tobytes() for row in solutions}
    assert len(seen) > 5000 and not seen & eval_grids
    assert task.overlap(256)[""] == {"share": 0.0, "seen": 0, "examples": 256, "method": task.overlap(1)[""]["method"]}
    # the pools themselves: distinct grids, on their sides
    p, s = task.pool(False)
    assert len({row.tobytes() for row in s}) == len(s) and not eval_side(s, 6).any()


# --- pool sizes -------------------------------------------------------------------------------------------------


def test_default_pools_hold_100k_training_puzzles():
    model = get_task("sudoku").params_model
    for params in ({"size": 6}, {"size": 9}, {"size": 6, "min_rounds": 5}, {"size": 9, "max_rounds": 10}):
        p = model.model_validate(params)
        assert p.pool >= 100_000 and p.eval_pool >= 4096
    search = model.model_validate({"size": 9, "givens": 26, "search": True})
    assert search.pool == 16384  # x 2 x 6^8 x 9! symmetries: distinct training puzzles far beyond 100,000
    orbit_9 = 2 * 6**8 * 362880
    assert search.pool * orbit_9 > 100_000


@pytest.mark.e2e
@pytest.mark.slow
def test_the_default_6x6_pool_has_100k_distinct_puzzles_from_distinct_grids(monkeypatch):
    monkeypatch.setattr(sudoku, "CHUNK", 1024)
    task = build_task("sudoku", {"size": 6, "givens": 12}, seed=0)
    puzzles, solutions = task.pool(False)
    assert len(puzzles) == 100_000
    assert len({row.tobytes() for row in solutions}) == 100_000
    assert len({row.tobytes() for row in puzzles}) == 100_000
