"""Sudoku puzzles against the solver and a brute-force count; the held-out grids; blank-cell metrics."""

import numpy as np
import pytest
import torch

from studyrunner.tasks import build_task
from studyrunner.tasks.sudoku import (
    all_grids_4,
    augment,
    count_solutions,
    grid_invariant,
    is_valid_grid,
    puzzle_pool,
    solve,
)


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


def test_9x9_symmetries_keep_the_invariant_so_train_and_eval_grids_never_meet():
    train_p, train_s = puzzle_pool(9, 40, 6, False)
    eval_p, eval_s = puzzle_pool(9, 40, 3, True)
    rng = np.random.default_rng(0)
    aug_p, aug_s = augment(rng, np.repeat(train_p, 4, 0), np.repeat(train_s, 4, 0), 9)
    assert not np.array_equal(aug_s, np.repeat(train_s, 4, 0))  # the augmentation does something
    for p, s, base in zip(aug_p, aug_s, np.repeat(train_s, 4, 0), strict=True):
        assert is_valid_grid(s.tolist(), 9) and solve(p.tolist(), 9, limit=2) == [s.tolist()]
        assert np.array_equal(grid_invariant(s), grid_invariant(base))
    train_keys = {tuple(grid_invariant(s)) for s in train_s}
    assert not train_keys & {tuple(grid_invariant(s)) for s in eval_s}
    # and the invariant does tell grids apart
    assert len(train_keys) == len(train_s)


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
