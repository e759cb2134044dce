"""Sudoku's levels: the declared heuristic floor is what its strategy scores, run for real on the eval sets, and a
singles solver held to fewer rounds than a puzzle needs does not solve it (so the floor, and depth, mean what the
task says they mean)."""

import numpy as np
import pytest
import torch

from studyrunner.tasks import build_task
from studyrunner.tasks.sudoku import BLANK, given_candidates
from studyrunner.tasks.sudoku_solver import STALLED, candidates, classify, singles

SETTINGS = [
    {"size": 4, "givens": 6},
    {"size": 6, "givens": 12, "pool": 256, "eval_pool": 256},
    {"size": 6, "givens": 12, "min_rounds": 4, "pool": 256, "eval_pool": 256},
    {"size": 9, "givens": 28, "pool": 64, "eval_pool": 64},
]
IDS = ["4x4", "6x6", "6x6-min4", "9x9"]


pytestmark = pytest.mark.usefixtures("small_sudoku_pools")


def _allowed_digits(puzzles: np.ndarray, size: int) -> list[list[list[int]]]:
    """Per puzzle, per cell: the digits no given of its row, column or box holds (the given itself for a given)."""
    masks = candidates(puzzles, size)
    return [
        [[v] if v else [d + 1 for d in range(size) if m >> d & 1] for v, m in zip(p, row, strict=True)]
        for p, row in zip(puzzles.tolist(), masks.tolist(), strict=True)
    ]


def _guess_logits(batch, size, rng, grids=None):
    """Logits of the strategy: each blank cell a digit drawn uniformly among those allowed by the filled cells of
    `grids` (default: the givens only), as one-hot logits, so the task's own `metrics` scores it."""
    grids = batch.inputs.numpy() if grids is None else grids
    allowed = _allowed_digits(grids, size)
    picks = np.array([[cell[rng.integers(len(cell))] for cell in p] for p in allowed])
    return torch.nn.functional.one_hot(torch.from_numpy(picks), size + 1).float()


@pytest.mark.parametrize("params", SETTINGS, ids=IDS)
def test_the_givens_strategy_scores_its_declared_floor(params):
    task = build_task("sudoku", params, seed=0)
    size = params["size"]
    batch = task.eval_sets(256)[""]
    floors = task.heuristic_floors(batch)
    levels = task.metric_levels(256)
    assert levels["eval_accuracy"].floor == pytest.approx(floors["accuracy"][0])
    assert "givens allow" in levels["eval_accuracy"].floor_strategy
    rng = np.random.default_rng(0)
    runs = [task.metrics(_guess_logits(batch, size, rng), batch) for _ in range(40)]
    accuracy = np.mean([r["accuracy"] for r in runs])
    exact = np.mean([r["exact_match"] for r in runs])
    blanks = int((batch.inputs == BLANK).sum())
    # the strategy's accuracy is a mean over 40 x blanks cells, each a hit with probability 1/allowed
    assert abs(accuracy - floors["accuracy"][0]) < 4 * 0.5 / np.sqrt(40 * blanks)
    assert abs(exact - floors["exact_match"][0]) < 4 * np.sqrt(max(floors["exact_match"][0], 1e-4) / (40 * 256))
    assert floors["accuracy"][0] > 1 / size  # above chance: the givens do pin cells down
    # and it is strictly below what one round of singles gives: the floor does none of the computation
    assert task.singles_ladder(256, rounds=1)[1]["accuracy"] > floors["accuracy"][0]


@pytest.mark.parametrize("params", SETTINGS, ids=IDS)
def test_fewer_rounds_than_a_puzzle_needs_do_not_solve_it(params):
    task = build_task("sudoku", params, seed=0)
    size = params["size"]
    batch = task.eval_sets(256)[""]
    puzzles, solutions = batch.inputs.numpy(), batch.targets.numpy()
    need = classify(puzzles, size)
    assert (need >= 1).all()  # every eval puzzle is finished by singles in these settings
    for k in range(0, int(need.max()) + 1):
        grids, rounds = singles(puzzles, size, max_rounds=k)
        full = (grids != BLANK).all(axis=1)
        assert not full[need > k].any()  # k rounds never finish a puzzle that needs more
        assert full[need <= k].all() and (grids[full] == solutions[full]).all()
        assert ((rounds == STALLED) == (need > k)).all()
    ladder = task.singles_ladder(256)
    assert ladder[0]["accuracy"] == pytest.approx(task.heuristic_floors(batch)["accuracy"][0])
    accuracies = [ladder[k]["accuracy"] for k in sorted(ladder)]
    assert accuracies == sorted(accuracies) and ladder[max(ladder)]["accuracy"] == 1.0
    for k, row in ladder.items():
        assert row["solved"] == pytest.approx((need <= k).mean())
    # k rounds then a guess among what is left, run for real, scores what the ladder declares
    k = max(1, int(np.median(need)) - 1)
    grids = singles(puzzles, size, max_rounds=k)[0]
    rng = np.random.default_rng(1)
    runs = [task.metrics(_guess_logits(batch, size, rng, grids), batch)["accuracy"] for _ in range(20)]
    blanks = int((puzzles == BLANK).sum())
    assert abs(np.mean(runs) - ladder[k]["accuracy"]) < 4 * 0.5 / np.sqrt(20 * blanks)


def test_difficulty_profile_counts_the_eval_puzzles_by_rounds():
    task = build_task(
        "sudoku", {"size": 6, "givens": 12, "min_rounds": 4, "max_rounds": 6, "pool": 64, "eval_pool": 128}, 0
    )
    profile = task.difficulty_profile(128)
    assert set(profile) == {"4", "5", "6", "search"} and profile["search"] == 0
    assert sum(profile.values()) == 128
    four = build_task("sudoku", {"size": 4, "givens": 6}, 0).difficulty_profile(512)
    assert set(four) <= {"1", "2", "3", "search"} and four["search"] == 0 and sum(four.values()) == 512


def test_given_candidates_counts_what_the_givens_allow():
    task = build_task("sudoku", {"size": 6, "givens": 12, "pool": 64, "eval_pool": 64}, 0)
    puzzles = task.eval_sets(16)[""].inputs.numpy()
    counts = given_candidates(puzzles, 6)
    allowed = _allowed_digits(puzzles, 6)
    assert counts.tolist() == [[len(cell) for cell in p] for p in allowed]
    solutions = task.eval_sets(16)[""].targets.numpy()
    assert all(
        s in cell for p, sol in zip(allowed, solutions.tolist(), strict=True) for cell, s in zip(p, sol, strict=True)
    )
