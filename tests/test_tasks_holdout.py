"""Every task: no eval example ever appears in the training stream; determinism; split/metric names."""

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from studyrunner.tasks import TASKS, build_task, get_task
from studyrunner.tasks.holdout import HOLDOUT, is_eval

# Small example spaces, where a training stream that ignored the held-out part would hit eval examples
# almost surely: `space` is the number of distinct examples (None: not counted), and the stream must
# cover over half of its training part, so the disjointness check below has teeth.
SMALL = [
    ("addition", {"digits": 1, "train_operands": [3], "eval_operands": [3]}, 1000),
    ("phop", {"alphabet": 2, "seq_len": 15, "hops": 1}, 8190),
    ("recall", {"key_alphabet": 8, "key_len": 2, "table_size": 33, "values": 4, "queries": 2}, 33 * 32),
    ("var_assign", {"width": 2, "names": 8, "values": 8}, 8 * 7 * 8 * 8 * 2),
    ("igsm", {"levels": 2, "level_width": 2, "nodes": 3, "max_terms": 1, "modulus": 3}, None),
    ("sudoku", {"size": 4, "givens": 15}, 288 * 16),
    ("mqar", {"pairs": 2, "queries": 2, "keys": 12, "values": 4}, 12 * 11 * 4 * 4 * 2),
]
# Tasks over a real text, held out by document with decontaminated eval windows: tests/test_tasks_text.py,
# tests/test_tasks_charlm_holdout.py. Their eval windows are each seed's own draw (`eval_seed` fixes one).
BY_POSITION = {"charlm", "text"}


def rows(batch):
    """One hashable key per example: inputs, targets and the scored positions."""
    keys = torch.cat([batch.inputs, batch.targets * batch.loss_mask, batch.loss_mask.long()], dim=1)
    return {tuple(r) for r in keys.tolist()}


@pytest.mark.parametrize("name,params,space", SMALL, ids=[s[0] for s in SMALL])
def test_no_eval_example_is_ever_trained_on(name, params, space):
    task = build_task(name, params, seed=0)
    evals = set().union(*(rows(b) for b in task.eval_sets(512).values()))
    seen = set()
    for step in range(300):
        seen |= rows(task.train_batch(step, 64))
    assert not seen & evals
    if space is not None:
        assert len(seen) > 0.5 * space * (1 - 1 / HOLDOUT)  # the stream covers the space: the check bites
    assert len(evals) > 1


def test_every_registered_task_is_covered():
    assert {name for name, *_ in SMALL} | BY_POSITION == set(TASKS)


DEFAULTS = [(name, {}) for name in sorted(TASKS)]


@pytest.mark.parametrize("name,params", DEFAULTS, ids=[d[0] for d in DEFAULTS])
def test_determinism_and_facts(name, params):
    a, b, other = build_task(name, params, 0), build_task(name, params, 0), build_task(name, params, 1)
    x, y = a.train_batch(7, 32), b.train_batch(7, 32)
    assert torch.equal(x.inputs, y.inputs) and torch.equal(x.targets, y.targets)
    assert torch.equal(x.loss_mask, y.loss_mask)
    assert not torch.equal(x.inputs, a.train_batch(8, 32).inputs)
    assert not torch.equal(x.inputs, other.train_batch(7, 32).inputs)
    fixed = {**params, "eval_seed": 0} if name in BY_POSITION else params  # per-seed eval draw: pin it
    ea, eb = build_task(name, fixed, 0).eval_sets(64), build_task(name, fixed, 5).eval_sets(64)
    assert list(ea) == list(eb) == a.split_names()
    for split in ea:
        assert torch.equal(ea[split].inputs, eb[split].inputs)
        assert torch.equal(ea[split].targets, eb[split].targets)
        assert len(ea[split]) == 64
    for batch in [x, *ea.values()]:
        assert batch.inputs.dtype == torch.long and batch.inputs.shape[1] <= a.facts.seq_len
        assert 0 <= int(batch.inputs.min()) and int(batch.inputs.max()) < a.facts.vocab_size
        assert int(batch.targets[batch.loss_mask].max()) < a.facts.vocab_size
        assert batch.loss_mask.any(dim=1).all()
    assert {"eval_accuracy", "eval_exact_match", "eval_loss"} <= a.reported_metrics()


@pytest.mark.parametrize("name,params", DEFAULTS, ids=[d[0] for d in DEFAULTS])
def test_perfect_predictions_score_one_and_wrong_ones_less(name, params):
    task = build_task(name, params, 0)
    batch = task.eval_sets(32)[task.split_names()[0]]
    logits = torch.nn.functional.one_hot(batch.targets, task.facts.vocab_size).float() * 20
    got = task.metrics(logits, batch)
    assert set(task.metric_kinds) <= set(got)
    assert got["accuracy"] == 1.0 and got["exact_match"] == 1.0
    assert task.loss(logits, batch).item() < 1e-3
    wrong = torch.roll(logits, 1, dims=-1)
    got = task.metrics(wrong, batch)
    assert got["accuracy"] == 0.0 and got["exact_match"] == 0.0


def test_holdout_partition_is_fixed_and_about_one_in_sixteen():
    keys = np.random.default_rng(0).integers(0, 1000, size=(20000, 3))
    first, again = is_eval(keys, 5), is_eval(keys.copy(), 5)
    assert np.array_equal(first, again)
    assert abs(first.mean() - 1 / HOLDOUT) < 0.01
    assert not np.array_equal(first, is_eval(keys, 6))  # the salt matters


@pytest.mark.parametrize(
    "name,bad,words",
    [
        ("addition", {"digits": 1, "eval_operands": [2]}, "1000"),
        ("phop", {"alphabet": 2, "seq_len": 8, "hops": 1}, "2^12"),
        ("recall", {"table_size": 16, "queries": 2}, "1024"),
        ("recall", {"key_alphabet": 4, "key_len": 1, "table_size": 8}, "exceeds"),
        ("recall", {"queries": 1}, "greater than or equal to 2"),
        ("var_assign", {"width": 1, "names": 4, "values": 2}, "4096"),
        ("var_assign", {"depth": 3, "width": 8, "names": 26}, "distinct names"),
        ("igsm", {"levels": 2, "level_width": 1, "nodes": 3}, "exceeds"),
        ("sudoku", {"size": 9, "givens": 20}, "between 24 and 80"),
        ("sudoku", {"size": 4, "givens": 3}, "between 4 and 15"),
        ("sudoku", {"size": 4, "givens": 16}, "between 4 and 15"),
        ("sudoku", {"size": 5}, "4 or 9"),
        ("sudoku", {"givens": "6"}, "integer"),
        ("sudoku", {"loss_on_givens": 1}, "boolean"),
        ("igsm", {"nodes": 6.5}, "integer"),
        ("var_assign", {"depth": True}, "integer"),
        ("recall", {"table": 4}, "Extra inputs"),
    ],
)
def test_settings_the_generator_cannot_serve_are_rejected_with_the_bound(name, bad, words):
    with pytest.raises(ValidationError) as err:
        get_task(name).params_model.model_validate(bad)
    assert words in str(err.value)


def test_integral_floats_are_accepted_for_ints():
    p = get_task("sudoku").params_model.model_validate({"size": 4.0, "givens": 6.0})
    assert p.size == 4 and p.givens == 6
