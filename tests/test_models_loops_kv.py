"""LoopLM and MELT (seed 001) and the KV cache: KV bytes, chunk-wise = token-serial,
incremental decoding = the full forward pass, exit probabilities, the interpolated transition."""

import math
from types import SimpleNamespace

import pytest
import torch

from studyrunner.models import build_model, count_params, get_family
from studyrunner.models.exits import exit_probabilities, kl_to_uniform, threshold_exit
from studyrunner.models.melt import LatentGate, MeltParams

FACTS = SimpleNamespace(vocab_size=13, seq_len=12, causal=True)
D, HEADS, BATCH, LENGTH = 16, 2, 3, 12


def build(family, **params):
    torch.manual_seed(0)
    return build_model(family, {"d_model": D, "n_heads": HEADS, **params}, FACTS)


def tokens(length=LENGTH):
    torch.manual_seed(1)
    return torch.randint(0, FACTS.vocab_size, (BATCH, length))


def decode(model, x, piece=1, loops=None):
    """Logits of x fed `piece` tokens at a time through one KV cache; and the cache."""
    cache = model.new_cache()
    with torch.no_grad():
        out = [model(x[:, i : i + piece], loops=loops, kv_cache=cache).logits for i in range(0, x.shape[1], piece)]
    return torch.cat(out, dim=1), cache


# --------------------------------------------------------------------------------------- KV bytes


@pytest.mark.parametrize("loops", [1, 2, 4, 8])
def test_measured_kv_bytes_are_L_N_2_d_bytes_times_T_for_looplm_and_constant_for_melt(loops):
    layers, fp32 = 2, 4
    per_sequence = LENGTH * layers * 2 * D * fp32  # L * N * 2 * d * bytes
    for family, rows_per_layer in (("looplm", loops), ("melt", 1)):
        model = build(family, block_layers=layers, loops=loops, chunk_size=1) if family == "melt" else None
        model = model or build(family, block_layers=layers, loops=loops)
        _, cache = decode(model.eval(), tokens())
        assert cache.nbytes() == BATCH * per_sequence * rows_per_layer  # measured from the cache's tensors
        assert cache.nbytes() / (BATCH * LENGTH) == model.kv_bytes_per_token()  # = the analytic count
        assert cache.rows_per_token() == layers * rows_per_layer


def test_melt_rows_are_updated_in_place_after_the_first_loop():
    model = build("melt", block_layers=2, loops=4, chunk_size=1).eval()
    cache = model.new_cache()
    x = tokens()
    with torch.no_grad():
        model(x[:, :1], kv_cache=cache)
        storages = {slot.k.untyped_storage().data_ptr() for slot in cache.slots.values()}
        rows = [slot.length for slot in cache.slots.values()]
        model(x[:, 1:2], kv_cache=cache)
    assert rows == [1, 1] and [s.length for s in cache.slots.values()] == [2, 2]  # one row per token per layer
    assert len(storages) == 2  # one keys tensor per layer, not per loop


# ---------------------------------------------------------------------------- decoding = full pass


DECODERS = {
    "looped": {"block_layers": 2, "loops": 3, "prefix_layers": 1, "suffix_layers": 1},
    "looped_rope": {"loops": 2, "pos": "rope"},
    "looplm": {"block_layers": 2, "loops": 3},
    "looplm_threshold": {"loops": 4, "pos": "rope", "exit_threshold": 0.5},
    "looplm_step": {"loops": 4, "exit_step": 2},
    "melt": {"block_layers": 2, "loops": 3, "chunk_size": 1},
    "melt_scalar_rope": {"loops": 4, "chunk_size": 1, "gate": "scalar", "pos": "rope", "h0": "zeros"},
}


@pytest.mark.parametrize("name", list(DECODERS))
@pytest.mark.parametrize("loops", [None, 2])
def test_incremental_decoding_equals_the_full_forward_pass(name, loops):
    model = build(name.split("_")[0], **DECODERS[name]).eval()
    x = tokens()
    with torch.no_grad():
        full = model(x, loops=loops).logits
    decoded, _ = decode(model, x, loops=loops)
    torch.testing.assert_close(decoded, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk", [2, 4, 5])
def test_melt_decoded_chunk_by_chunk_equals_its_chunk_wise_forward(chunk):
    model = build("melt", block_layers=2, loops=3, chunk_size=chunk, pos="rope").eval()
    x = tokens()
    with torch.no_grad():
        full = model(x).logits
    decoded, cache = decode(model, x, piece=chunk)
    torch.testing.assert_close(decoded, full, atol=1e-5, rtol=0)
    assert cache.length == LENGTH


@pytest.mark.parametrize("gate", ["elementwise", "scalar", "mean", "ema", "last"])
@pytest.mark.parametrize("h0", ["input", "zeros"])
def test_chunk_size_1_training_logits_equal_token_serial_inference(gate, h0):
    """The training forward (gradients on: rows replaced functionally) with chunk size 1 computes what
    token-by-token decoding (no gradients: rows overwritten in place) computes."""
    model = build("melt", block_layers=2, loops=3, chunk_size=1, gate=gate, h0=h0)
    x = tokens()
    model.train()  # dropout is 0: train mode differs only in that gradients are recorded
    training = model(x).logits
    assert training.requires_grad
    serial, _ = decode(model.eval(), x)
    torch.testing.assert_close(training.detach(), serial, atol=1e-5, rtol=0)


def test_chunks_matter_when_loops_do():
    """A chunk attends to its own current-loop rows, token-serial inference to final rows: they differ
    for T > 1 (the paper's fully parallel training mismatch) and agree for T = 1."""
    x = tokens()
    for loops, same in ((3, False), (1, True)):
        serial = build("melt", loops=loops, chunk_size=1).eval()
        parallel = build("melt", loops=loops, chunk_size=LENGTH).eval()
        with torch.no_grad():
            a, b = serial(x).logits, parallel(x).logits
        assert torch.allclose(a[:, 0], b[:, 0], atol=1e-6)  # the first token has no earlier rows
        assert torch.allclose(a, b, atol=1e-5) == same


def test_chunk_grad_detached_stops_gradients_into_earlier_chunks():
    x = tokens()
    grads = {}
    for mode in ("through", "detached"):
        model = build("melt", loops=2, chunk_size=4, chunk_grad=mode)
        emb = model.embed.tokens.weight
        logits = model(x).logits
        logits[:, 8:].sum().backward()  # a loss on the last chunk only
        used_first = x[:, :4].flatten().unique()
        only_first = [t for t in used_first.tolist() if t not in x[:, 4:].flatten().tolist()]
        grads[mode] = emb.grad[only_first].abs().sum().item() if only_first else None
    assert grads["through"] is not None and grads["through"] > 0
    assert grads["detached"] == 0


def test_a_one_loop_melt_is_a_one_loop_looplm():
    """h0: input makes the first loop's latent the layer input: MELT at T = 1 is LoopLM at T = 1."""
    x = tokens()
    looplm = build("looplm", block_layers=2, loops=1).eval()
    melt = build("melt", block_layers=2, loops=1, chunk_size=3).eval()
    melt.load_state_dict({k: v for k, v in looplm.state_dict().items() if not k.startswith("exit_gate")}, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(melt(x).logits, looplm(x).logits, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------- gates


def test_gate_variants_follow_their_update_rules():
    torch.manual_seed(0)
    u = [torch.randn(2, 3, D) for _ in range(4)]
    for gate, expected in (
        ("mean", lambda t: torch.stack(u[: t + 1]).mean(0)),
        ("last", lambda t: u[t]),
    ):
        module = LatentGate(MeltParams(d_model=D, n_heads=HEADS, gate=gate))
        h = u[0]
        for t in range(1, 4):
            h, z = module(u[t], h, t)
            assert z is None
            torch.testing.assert_close(h, expected(t))
    ema = LatentGate(MeltParams(d_model=D, n_heads=HEADS, gate="ema", ema_decay=0.3))
    h, _ = ema(u[1], u[0], 1)
    torch.testing.assert_close(h, 0.3 * u[0] + 0.7 * u[1])
    for gate, width in (("elementwise", D), ("scalar", 1)):
        module = LatentGate(MeltParams(d_model=D, n_heads=HEADS, gate=gate, gate_bias_init=-2.0))
        assert torch.all(module.w.bias == -2.0)
        h, z = module(u[1], u[0], 1)
        assert z.shape == (2, 3, width) and ((z > 0) & (z < 1)).all()
        torch.testing.assert_close(h, z * u[0] + (1 - z) * u[1])


def test_gate_parameters_are_2_N_d_squared_plus_N_d_for_elementwise():
    base = count_params(build("melt", block_layers=3, gate="last"))
    assert count_params(build("melt", block_layers=3)) - base == 3 * (2 * D * D + D)  # seed 001's 24 x 2048^2 x 2
    assert count_params(build("melt", block_layers=3, gate="scalar")) - base == 3 * (2 * D + 1)


def test_gate_statistics_per_loop_step_are_declared_and_reported():
    model = build("melt", block_layers=2, loops=4, chunk_size=4).eval()
    out = model(tokens(), diagnose=True)
    params = get_family("melt").params_model.model_validate({"d_model": D, "n_heads": HEADS, "block_layers": 2})
    assert set(out.diagnostics) == params.diagnostic_names()
    assert {f"gate_mean_step_{t}" for t in (2, 3, 4)} <= set(out.diagnostics)  # the first loop is ungated
    sigmoid_bias = 1 / (1 + math.exp(-params.gate_bias_init))
    assert abs(out.diagnostics["gate_mean"] - sigmoid_bias) < 0.15  # starts near 0.2
    assert model(tokens()).diagnostics == {}


def test_melt_refuses_a_bidirectional_task():
    with pytest.raises(ValueError, match="bidirectional"):
        build_model("melt", {"d_model": D, "n_heads": HEADS}, SimpleNamespace(vocab_size=5, seq_len=4, causal=False))


# ------------------------------------------------------------------------------------------- exits


def test_exit_probabilities_sum_to_one_and_the_last_step_takes_the_remainder():
    torch.manual_seed(0)
    for steps in (1, 2, 4, 8):
        lambdas = [torch.rand(5, 7) for _ in range(steps)]
        probs = exit_probabilities(lambdas)
        torch.testing.assert_close(torch.stack(probs).sum(0), torch.ones(5, 7))
        assert all((p >= 0).all() for p in probs)
        if steps > 1:
            torch.testing.assert_close(probs[0], lambdas[0])
            torch.testing.assert_close(probs[-1], torch.prod(1 - torch.stack(lambdas[:-1]), 0))
        assert kl_to_uniform(probs).item() >= -1e-6


def test_threshold_exit_is_the_first_step_whose_cdf_reaches_q():
    probs = [torch.tensor([[0.1, 0.6]]), torch.tensor([[0.3, 0.3]]), torch.tensor([[0.6, 0.1]])]
    assert threshold_exit(probs, 0.35).tolist() == [[1, 0]]
    assert threshold_exit(probs, 1.0).tolist() == [[2, 2]]


@pytest.mark.parametrize("loops", [None, 2, 6])
def test_looplm_exit_distribution_sums_to_one_at_any_depth(loops):
    model = build("looplm", block_layers=2, loops=4).eval()
    out = model(tokens(), loops=loops, diagnose=loops is None)
    if loops is None:
        total = sum(out.diagnostics[f"exit_prob_step_{t}"] for t in range(1, 5))
        assert total == pytest.approx(1.0, abs=1e-6)
    model.train()
    exits = model(tokens(), loops=loops).exits
    assert len(exits) == (loops or 4)
    torch.testing.assert_close(torch.stack([w for _, w in exits]).sum(0), torch.ones(BATCH, LENGTH))


def test_looplm_inference_exit_rules():
    x = tokens()
    last = build("looplm", loops=3).eval()
    fixed = build("looplm", loops=3, exit_step=1).eval()
    always = build("looplm", loops=3, exit_threshold=1e-9).eval()  # exits at once
    with torch.no_grad():
        logits, _ = last.run(x, 3)
        torch.testing.assert_close(last(x).logits, logits[-1])
        torch.testing.assert_close(fixed(x).logits, logits[0])
        torch.testing.assert_close(always(x).logits, logits[0])
        assert always(x, diagnose=True).diagnostics["exit_step_mean"] == 1.0


# --------------------------------------------------------------------------------- the conversion


@pytest.mark.parametrize("chunk", [1, 4])
def test_interpolation_at_alpha_0_is_the_teacher_and_at_alpha_1_is_melt(chunk):
    teacher = build("looplm", block_layers=2, loops=3).eval()
    student = build("melt", block_layers=2, loops=3, chunk_size=chunk, interpolate_steps=10)
    student.convert_from(teacher)
    student.eval()
    x = tokens()
    with torch.no_grad():
        student.set_train_step(0)
        assert student.alpha == 0.0
        torch.testing.assert_close(student(x).logits, teacher(x).logits, atol=1e-5, rtol=0)
        student.set_train_step(10)
        plain = build("melt", block_layers=2, loops=3, chunk_size=chunk)
        plain.load_state_dict(student.state_dict())
        torch.testing.assert_close(student(x).logits, plain.eval()(x).logits)
    assert not any(p is q for p in student.parameters() for q in teacher.parameters())
    assert all(not p.requires_grad for p in teacher.parameters())
    assert count_params(student) == count_params(plain)  # the teacher is no submodule


def test_distillation_terms_are_zero_for_a_student_equal_to_its_teacher():
    teacher = build("looplm", block_layers=2, loops=2)
    student = build("melt", block_layers=2, loops=2, chunk_size=2, teacher="t-0123456789ab-s0", gate="last")
    student.convert_from(teacher)
    student.train()
    out = student(tokens(2))  # two tokens, one chunk: MELT's rows equal the LoopLM's here
    assert set(out.aux) == {"distill", "attn_align"}
    assert out.aux["distill"].item() == pytest.approx(0.0, abs=1e-6)
    assert out.aux["attn_align"].item() == pytest.approx(0.0, abs=1e-10)
    out = student(tokens())
    assert out.aux["distill"].item() > 1e-6 and out.aux["attn_align"].requires_grad  # well above rounding
    with pytest.raises(ValueError, match="looplm teacher with loops = 2"):
        student.convert_from(build("looplm", block_layers=2, loops=3))
