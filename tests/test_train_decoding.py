"""The decoding evaluation, memory accounting and the expected loss over exits;
the mqar and charlm tasks."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from studyrunner.models import ModelOutput, build_model
from studyrunner.study.compiler import resolve
from studyrunner.tasks import Batch, build_task
from studyrunner.tasks.charlm import VOCAB, encoded_text, load_text
from studyrunner.train import MemoryReporter, run_trial
from studyrunner.train.decoding import decode, decoding_eval
from studyrunner.train.engine import task_loss

MQAR = {"name": "mqar", "params": {"pairs": 4, "queries": 2, "keys": 16, "values": 16}}


def config(family, task=MQAR, train=None, **params):
    return resolve(
        {
            "task": task,
            "model": {"family": family, "params": {"d_model": 16, "n_heads": 2, "block_layers": 2, **params}},
            "train": {"steps": 8, "batch_size": 8, "lr": 1e-3, "warmup_steps": 1, "log_every": 4, **(train or {})},
            "eval": {"every": 8, "examples": 24},
        }
    )


@pytest.mark.parametrize(
    "family,params,rows",
    [("looped", {"loops": 3}, 6), ("looplm", {"loops": 3}, 6), ("melt", {"loops": 3, "chunk_size": 2}, 2)],
)
def test_a_trial_reports_decoding_and_memory_metrics(family, params, rows):
    train = {"exit_entropy_beta": 0.05} if family == "looplm" else None
    final = run_trial(config(family, train=train, **params), seed=0)
    per_token = rows * 2 * 16 * 4  # rows x 2 x d x fp32 bytes
    assert final["kv_cache_bytes_per_token"] == final["kv_cache_bytes_per_token_analytic"] == per_token
    assert final["kv_cache_bytes"] == per_token * 24 * 11  # 24 examples of 11 tokens decoded
    assert final["weights_bytes"] == 4 * final["params"]
    assert final["eval_peak_memory_bytes"] > final["kv_cache_bytes"]
    for name in ("eval_decode_loss", "eval_decode_accuracy", "eval_decode_exact_match", "decode_tokens_per_sec"):
        assert math.isfinite(final[name]), name
    task = build_task(MQAR["name"], MQAR["params"], 0)
    assert task.decode_metric_names() <= set(final)


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_kv_bytes_follow_the_compute_dtype_under_bf16_autocast(pos):
    task = build_task(MQAR["name"], MQAR["params"], 0)
    model = build_model("looplm", {"d_model": 16, "n_heads": 2, "loops": 2, "pos": pos}, task.facts)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = decoding_eval(model, task, task.eval_sets(4))
    assert out["kv_cache_bytes_per_token"] == out["kv_cache_bytes_per_token_analytic"] == 2 * 2 * 16 * 2


def test_decoded_answers_are_fed_back_and_streamed_text_is_not():
    task = build_task(MQAR["name"], MQAR["params"], 0)
    batch = task.eval_sets(8)[""]
    model = build_model("looped", {"d_model": 16, "n_heads": 2}, task.facts).eval()
    logits, fed, _ = decode(model, batch, feedback=True)
    scored = batch.loss_mask[:, :-1]
    assert torch.equal(fed[:, 1:][scored], logits[:, :-1].argmax(-1)[scored])  # answers are the model's
    assert torch.equal(fed[:, 1:][~scored], batch.inputs[:, 1:][~scored])  # everything else is the prompt
    _, streamed, _ = decode(model, batch, feedback=False)
    assert torch.equal(streamed, batch.inputs)


def test_streamed_bits_per_character_equal_the_teacher_forced_ones():
    task = build_task("charlm", {"seq_len": 24}, 0)
    splits = task.eval_sets(6)
    model = build_model("looplm", {"d_model": 16, "n_heads": 2, "loops": 2}, task.facts).eval()
    with torch.no_grad():
        forced = task.metrics(model(splits[""].inputs).logits, splits[""])
    decoded = decoding_eval(model, task, splits)
    assert decoded["eval_decode_bpc"] == pytest.approx(forced["bpc"], abs=1e-5)
    assert decoded["eval_decode_bpc"] == pytest.approx(decoded["eval_decode_loss"] / math.log(2), rel=1e-6)


def test_expected_loss_over_exits_is_the_weighted_sum_of_per_exit_losses():
    task = build_task(MQAR["name"], MQAR["params"], 0)
    batch = task.train_batch(0, 4)
    torch.manual_seed(0)
    logits = [torch.randn(*batch.inputs.shape, task.facts.vocab_size) for _ in range(3)]
    w = torch.softmax(torch.randn(3, *batch.inputs.shape), dim=0)
    out = ModelOutput(logits=logits[-1], exits=list(zip(logits, w, strict=True)))
    mask = batch.loss_mask
    ce = torch.stack([F.cross_entropy(lg[mask], batch.targets[mask], reduction="none") for lg in logits])
    assert task_loss(task, out, batch).item() == pytest.approx((w[:, mask] * ce).sum(0).mean().item(), rel=1e-6)
    assert task_loss(task, ModelOutput(logits=logits[0]), batch).item() == pytest.approx(ce[0].mean().item())


def test_looplm_logs_its_exit_regulariser_and_exit_statistics():
    reporter = MemoryReporter()
    final = run_trial(config("looplm", train={"exit_entropy_beta": 0.1}, loops=3), seed=0, reporter=reporter)
    assert final["exit_kl_uniform_weight"] == 0.1
    assert final["train_exit_kl_uniform"] >= 0
    assert sum(final[f"exit_prob_step_{t}"] for t in (1, 2, 3)) == pytest.approx(1.0, abs=1e-5)
    assert 1 <= final["exit_step_expected"] <= 3 and final["exit_step_mean"] == 3.0


def test_melt_interpolation_alpha_follows_the_training_step():
    reporter = MemoryReporter()
    cfg = config("melt", loops=2, chunk_size=4, interpolate_steps=6)
    cfg["eval"]["every"] = 2
    run_trial(cfg, seed=0, reporter=reporter)
    assert reporter.series("interp_alpha") == [(2, 1 / 6), (4, 3 / 6), (6, 5 / 6), (8, 1.0)]


# ------------------------------------------------------------------------------------------- tasks


def test_mqar_examples_ask_keys_of_their_own_context():
    task = build_task("mqar", {"pairs": 6, "queries": 3, "keys": 20, "values": 10}, 3)
    batch = task.train_batch(5, 64)
    seq = torch.cat([batch.inputs, batch.targets[:, -1:]], dim=1)
    for row in seq.tolist():
        keys, values = row[:12:2], row[1:12:2]
        assert len(set(keys)) == 6 and all(k < 20 for k in keys) and all(20 <= v < 30 for v in values)
        table = dict(zip(keys, values, strict=True))
        asked = row[12::2]
        assert len(set(asked)) == 3 and all(row[12 + 2 * i + 1] == table[q] for i, q in enumerate(asked))
    assert batch.loss_mask.sum(1).tolist() == [3] * 64
    assert torch.equal(batch.targets[batch.loss_mask].view(64, 3), seq[:, 13::2])
    assert task.facts.seq_len == batch.inputs.shape[1] == 17 and task.decodes and task.decode_feedback


def test_charlm_reads_the_standard_librarys_help_topics_into_a_fixed_vocabulary():
    from pydoc_data.topics import topics

    text = load_text()
    assert len(text) > 100_000 and topics["assert"] in text
    ids = encoded_text()
    assert len(ids) == len(text) and ids.min() >= 0 and ids.max() < VOCAB
    assert ids[text.index("\n")] == 0 and ids[text.index("a")] == ord("a") - 31
    assert "".join(chr(i + 31) for i in ids[:10]) == text[:10]


def test_charlm_trains_and_evaluates_on_disjoint_stretches_of_the_text():
    task = build_task("charlm", {"seq_len": 64, "block_chars": 512}, 0)
    width = 65
    evals = set()
    for start in task.eval_starts.tolist():
        evals |= set(range(start, start + width))
    train = np.unique(task.train_starts[:, None] + np.arange(width))
    assert not evals & set(train.tolist())  # no character position is in both
    held = len(evals) / len(task.text)
    assert 0.03 < held < 0.1  # about 1 block in 16
    batch = task.train_batch(0, 16)
    assert batch.loss_mask.all() and torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
    assert task.eval_capacity() == len(task.eval_starts)
    starts = task.train_starts[np.random.default_rng([0, 0, 0xC4A2]).integers(0, len(task.train_starts), 16)]
    assert torch.equal(batch.inputs, torch.from_numpy(task.text[starts[:, None] + np.arange(64)]))


def test_charlm_bits_per_character():
    task = build_task("charlm", {"seq_len": 16}, 0)
    batch = task.eval_sets(4)[""]
    uniform = torch.zeros(*batch.inputs.shape, VOCAB)
    assert task.metrics(uniform, batch)["bpc"] == pytest.approx(math.log2(VOCAB))
    assert isinstance(batch, Batch)


PHOP = {"name": "phop", "params": {"alphabet": 4, "seq_len": 12, "hops": 1}}


@pytest.mark.parametrize(
    "family,params",
    [("looped", {"loops": 3, "prefix_layers": 1}), ("looplm", {"loops": 3}), ("melt", {"loops": 3, "chunk_size": 2})],
)
def test_a_task_without_decoding_reports_the_kv_bytes_a_decoding_task_measures(family, params):
    """A family with a KV cache reports a KV figure on p-hop too, where no decoding evaluation runs: the analytic
    bytes per token, which equal what decoding the same model's shape measures."""
    train = {"exit_entropy_beta": 0.05} if family == "looplm" else None
    on_phop = run_trial(config(family, task=PHOP, train=train, **params), seed=0)
    decoded = run_trial(config(family, train=train, **params), seed=0)  # mqar decodes: the cache is measured
    assert "eval_decode_loss" not in on_phop and "kv_cache_bytes" not in on_phop
    assert on_phop["kv_cache_bytes_per_token"] == on_phop["kv_cache_bytes_per_token_analytic"]
    assert on_phop["kv_cache_bytes_per_token"] == decoded["kv_cache_bytes_per_token"]  # measured from the tensors
    assert build_task(PHOP["name"], PHOP["params"], 0).decode_metric_names() <= set(on_phop)


def test_the_analytic_kv_bytes_follow_the_compute_dtype_and_an_encoder_keeps_no_cache():
    from studyrunner.study import compile_study, loads
    from studyrunner.train.decoding import has_kv_cache, kv_footprint

    task = build_task(MQAR["name"], MQAR["params"], 0)
    model = build_model("melt", {"d_model": 16, "n_heads": 2, "block_layers": 2, "loops": 3}, task.facts)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        measured = decoding_eval(model, task, task.eval_sets(4))["kv_cache_bytes_per_token"]
        assert kv_footprint(model)["kv_cache_bytes_per_token"] == measured == 2 * 2 * 16 * 2  # N rows, bf16
    sudoku = build_task("sudoku", {"size": 4}, 0)
    assert not has_kv_cache(build_model("looped", {"d_model": 16, "n_heads": 2}, sudoku.facts), sudoku)
    # `validate` knows p-hop trials of such a family report it: a study may optimise or claim it
    study = compile_study(
        loads(
            "name: kv\ntask: {name: phop, params: {alphabet: 4, seq_len: 12, hops: 1}}\n"
            "model: {family: looplm, params: {d_model: 16, n_heads: 2, loops: 2}}\n"
            "train: {steps: 4, batch_size: 8, lr: 1.0e-3}\neval: {every: 4, examples: 16}\nseeds: [0]\n"
            "metric: {name: kv_cache_bytes_per_token, mode: min}\n"
        )
    )
    assert study.study.metric.name == "kv_cache_bytes_per_token"
