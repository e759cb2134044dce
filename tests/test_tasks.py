"""Task generators against their formal definitions, and their determinism contract."""

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from studyrunner.tasks import build_task, get_task
from studyrunner.tasks.phop import hop_answer, sample_phop


@pytest.mark.parametrize(
    "alphabet,n,p",
    [
        (4, 32, 2), (4, 32, 1), (4, 64, 4), (2, 24, 3), (8, 16, 1),
        # more hops (the calibrated CPU settings and the paper's p = 16, 32): rejection sampling of the gaps where
        # they fit often, the bounded sampler where they almost never do (p = 14 at n = 32: 0.6%; p = 15: none)
        (4, 32, 4), (4, 32, 8), (4, 48, 8), (4, 64, 16), (4, 32, 14), (4, 32, 15), (4, 66, 32), (4, 256, 32),
    ],
)  # fmt: skip
def test_phop_samples_match_the_formal_definition(alphabet, n, p):
    seqs, answers = sample_phop(np.random.default_rng(n * p), 500, alphabet, n, p)
    assert seqs.shape == (500, n)
    assert seqs.min() >= 0 and seqs.max() < alphabet
    for seq, answer in zip(seqs.tolist(), answers.tolist(), strict=True):
        assert hop_answer(seq, p) == answer  # never bottom, always the built answer


@pytest.mark.parametrize(
    "params", [{"seq_len": 32, "hops": 4}, {"seq_len": 32, "hops": 8}, {"seq_len": 34, "hops": 16}]
)
def test_phop_with_more_hops_trains_and_evaluates_on_valid_chains(params):
    """The task's batches at larger p: every answer is the formal definition's (never bottom), the chain of p
    hops fits (2p + 2 <= n), answers stay balanced, and eval sequences are never training sequences."""
    task = build_task("phop", {"alphabet": 4, **params}, seed=0)
    p = params["hops"]
    train, held = task.train_batch(0, 256), task.eval_sets(1024)[""]
    for batch in (train, held):
        for seq, target in zip(batch.inputs.tolist(), batch.targets[:, -1].tolist(), strict=True):
            assert hop_answer(seq, p) == target
    counts = np.bincount(held.targets[:, -1].numpy(), minlength=4) / 1024
    assert np.all(np.abs(counts - 0.25) < 0.05), counts
    assert task.is_eval_example(held.inputs.numpy()).all() and not task.is_eval_example(train.inputs.numpy()).any()
    assert task.overlap(256)[""].share == 0.0  # exact: the partition the stream redraws


@pytest.mark.parametrize("params", [{"seq_len": 32, "hops": 2}, {"seq_len": 32, "hops": 8}, {"seq_len": 64, "hops": 8}])
def test_phop_position_vote_is_what_a_fitted_positional_strategy_reaches(params):
    """The answer's position is predictable from the gap distribution alone: a strategy fitted on training
    batches (per position, how much more often than chance the token there is the answer), voting without
    following a hop, scores about the position vote's figure on the eval set, well above chance."""
    task = build_task("phop", {"alphabet": 4, **params}, seed=0)
    hits = np.zeros(params["seq_len"])
    for step in range(40):
        batch = task.train_batch(step, 64)
        hits += (batch.inputs.numpy() == batch.targets[:, -1].numpy()[:, None]).sum(axis=0)
    weight = hits / (40 * 64) - 0.25  # above chance: where the answer lies
    held = task.eval_sets(2048)[""]
    seqs, answers = held.inputs.numpy(), held.targets[:, -1].numpy()
    votes = np.stack([(weight[None, :] * (seqs == k)).sum(axis=1) for k in range(4)], axis=1)
    fitted = float(np.mean(votes.argmax(axis=1) == answers))
    floor, strategy = task.position_vote(held)
    assert "no hop followed" in strategy and task.metric_levels(2048)["eval_accuracy"].chance == 0.25
    assert floor > 0.33 and abs(fitted - floor) < 0.04, (fitted, floor)


def test_phop_refuses_a_chain_that_cannot_fit():
    with pytest.raises(ValidationError, match="16-hop chain needs seq_len >= 34"):
        build_task("phop", {"seq_len": 32, "hops": 16}, seed=0)


def test_formal_definition_by_hand():
    # v = a b a c b, n=5: find_1(5)=max{j<=5: v[j-1]=v[5]=b} = 3 (v[2]=b), answer v[3] = a
    a, b, c = 0, 1, 2
    assert hop_answer([a, b, a, c, b], 1) == a
    # second hop from position 3 (token a): v[j-1]=a for j=2 -> position 2, token b
    assert hop_answer([a, b, a, c, b], 2) == b
    assert hop_answer([a, b, c], 1) is None  # c never occurred before: bottom
    assert hop_answer([b, b], 1) == b  # the degenerate self-loop find_1(i) = i is allowed


def test_phop_answers_are_balanced_and_only_the_last_position_is_scored():
    task = build_task("phop", {"alphabet": 4, "seq_len": 32, "hops": 2}, seed=0)
    batch = task.eval_sets(4000)[""]
    counts = np.bincount(batch.targets[:, -1].numpy(), minlength=4) / 4000
    assert np.all(np.abs(counts - 0.25) < 0.03), counts
    assert batch.loss_mask[:, -1].all() and batch.loss_mask.sum() == 4000
    assert task.facts.vocab_size == 4 and task.facts.seq_len == 32 and task.facts.causal


@pytest.mark.parametrize("name,params", [("phop", {}), ("addition", {"train_operands": [2, 3]})])
def test_train_batches_depend_only_on_seed_and_step(name, params):
    a, b = build_task(name, params, seed=0), build_task(name, params, seed=0)
    assert torch.equal(a.train_batch(5, 16).inputs, b.train_batch(5, 16).inputs)
    assert not torch.equal(a.train_batch(5, 16).inputs, a.train_batch(6, 16).inputs)
    other = build_task(name, params, seed=1)
    assert not torch.equal(a.train_batch(5, 16).inputs, other.train_batch(5, 16).inputs)


@pytest.mark.parametrize("name,params", [("phop", {}), ("addition", {"eval_operands": [2, 4]})])
def test_eval_sets_are_the_same_for_every_seed(name, params):
    a, b = build_task(name, params, seed=0).eval_sets(64), build_task(name, params, seed=9).eval_sets(64)
    assert a.keys() == b.keys()
    for split in a:
        assert torch.equal(a[split].inputs, b[split].inputs)
        assert torch.equal(a[split].targets, b[split].targets)


def decode_addition(task, inputs, targets, mask):
    """Operands from the prompt, answer from the scored targets."""
    tokens = inputs.tolist()
    prompt = tokens[: tokens.index(11)]
    operands = [int("".join(map(str, g))) for g in _split(prompt, 10)]
    digits = targets[mask].tolist()
    if task.p.reverse_answer:
        digits = digits[::-1]
    return operands, int("".join(map(str, digits)))


def _split(tokens, sep):
    group, out = [], []
    for t in tokens:
        if t == sep:
            out.append(group)
            group = []
        else:
            group.append(t)
    return out + [group]


@pytest.mark.parametrize("reverse", [True, False])
@pytest.mark.parametrize("digits", [1, 3])
def test_addition_targets_are_the_sum_of_the_operands(reverse, digits):
    task = build_task(
        "addition",
        {"digits": digits, "train_operands": [2, 5], "eval_operands": [3, 8], "reverse_answer": reverse},
        seed=3,
    )
    batches = list(task.eval_sets(50).values()) + [task.train_batch(s, 50) for s in range(4)]
    for batch in batches:
        assert batch.inputs.shape[1] <= task.facts.seq_len
        assert batch.loss_mask.sum(1).eq(task.answer_digits).all()
        # teacher forcing: targets are the inputs shifted by one
        assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
        for i in range(len(batch)):
            operands, answer = decode_addition(task, batch.inputs[i], batch.targets[i], batch.loss_mask[i])
            assert all(len(str(o)) <= digits for o in operands)
            assert answer == sum(operands)


def test_addition_eval_splits_include_unseen_counts():
    task = build_task("addition", {"train_operands": [2], "eval_operands": [2, 4]}, seed=0)
    splits = task.eval_sets(10)
    assert list(splits) == ["n2", "n4"]
    assert splits["n4"].inputs.shape[1] == task.facts.seq_len  # the longest split fits the model
    assert task.answer_digits == 4  # 4 * 999 = 3996


@pytest.mark.parametrize(
    "name,bad",
    [
        ("phop", {"hops": 0}),
        ("phop", {"alphabet": 1}),
        ("phop", {"hop": 2}),
        ("phop", {"seq_len": 6, "hops": 4}),
        ("addition", {"digits": 0}),
        ("addition", {"train_operands": []}),
        ("addition", {"eval_operands": [1]}),
    ],
)
def test_bad_task_params_are_rejected(name, bad):
    with pytest.raises(ValidationError):
        get_task(name).params_model.model_validate(bad)
