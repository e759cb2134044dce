"""Memory tokens, gated memory banks and the `adaptive_layers` family (seed 000)."""

from types import SimpleNamespace

import pytest
import torch

from studyrunner.models import build_model, count_params
from studyrunner.models.memory import AttentionMass, MemoryTokens, probing

FACTS = SimpleNamespace(vocab_size=7, seq_len=10, causal=True)


def adaptive(**params):
    torch.manual_seed(0)
    base = {"d_model": 16, "n_heads": 2, "n_layers": 2, "loops": 3}
    return build_model("adaptive_layers", {**base, **params}, FACTS)


def tokens(b=3):
    torch.manual_seed(1)
    return torch.randint(0, 7, (b, 10))


@pytest.mark.parametrize("bias,gate", [(-3.0, 0.0474), (0.0, 0.5), (3.0, 0.9526)])
def test_gate_bias_sets_the_initial_gate(bias, gate):
    model = adaptive(memory_slots=8, memory_global_slots=4, gate_bias_init=bias).eval()
    d = model(tokens(), diagnose=True).diagnostics
    for name in ("gate_local_mean", "gate_global_mean", "gate_local_mean_layer_0", "gate_global_mean_layer_1"):
        assert d[name] == pytest.approx(gate, abs=1e-3), name


def test_vector_gates_have_one_gate_per_feature():
    scalar, vector = adaptive(memory_slots=4), adaptive(memory_slots=4, gate_granularity="vector")
    assert scalar.layers[0].memory.local_gate.linear.out_features == 1
    assert vector.layers[0].memory.local_gate.linear.out_features == 16
    assert count_params(vector) - count_params(scalar) == 2 * 15 * (16 + 1)  # 2 layers, 15 more rows


def test_memory_changes_the_output_through_the_gate():
    closed = adaptive(memory_slots=4, gate_bias_init=-30.0).eval()
    none = adaptive().eval()
    # a fully closed gate adds (almost) nothing: same weights as the memory-free model give the same logits
    none.load_state_dict(closed.state_dict(), strict=False)
    torch.testing.assert_close(closed(tokens()).logits, none(tokens()).logits, atol=1e-5, rtol=0)
    opened = adaptive(memory_slots=4, gate_bias_init=3.0).eval()
    none.load_state_dict(opened.state_dict(), strict=False)
    assert not torch.allclose(opened(tokens()).logits, none(tokens()).logits, atol=1e-3)


def test_global_bank_is_shared_by_all_layers():
    model = adaptive(n_layers=3, memory_global_slots=5)
    banks = [p for n, p in model.named_parameters() if "global_bank" in n]
    assert len(banks) == 2  # one K and one V for the whole model
    assert count_params(adaptive(n_layers=3, memory_global_slots=10)) - count_params(model) == 2 * 5 * 16


def test_loop_scale_at_minus_seven_makes_extra_steps_near_identity():
    model = adaptive(loops=3, loop_scale_init=-7.0).eval()
    once = model(tokens(), loops=1).logits  # each layer's ordinary pass only
    looped = model(tokens()).logits
    assert (looped - once).abs().max() < 1e-2
    # and the scale is what makes it so: alpha = 0 (softplus ~0.69) moves far from identity
    loud = adaptive(loops=3, loop_scale_init=0.0).eval()
    assert (loud(tokens()).logits - loud(tokens(), loops=1).logits).abs().max() > 1e-2


def test_pondernet_diagnostics_at_init():
    model = adaptive(loops=3, halt_bias_init=0.0).eval()
    out = model(tokens(), diagnose=True)
    d = out.diagnostics
    # p = 0.5 everywhere: weights 0.5, 0.25, 0.25 (remainder on the last step) -> E[n] = 1.75
    assert [d[f"halt_weight_step_{t}"] for t in (1, 2, 3)] == pytest.approx([0.5, 0.25, 0.25])
    assert d["expected_steps_layer_0"] == d["expected_steps_layer_1"] == pytest.approx(1.75)
    assert out.aux["ponder"].item() == pytest.approx((1.75 - 1) / (3 - 1))
    assert d["loop_scale_step_2_layer_0"] == pytest.approx(9.1e-4, rel=0.01)


def test_ponder_term_reaches_the_routers():
    model = adaptive(loops=3)
    model(tokens()).aux["ponder"].backward()
    grads = model.grad_norm_groups()["router"]
    assert len(grads) == 4 and all(p.grad is not None for p in grads)
    assert sum(p.grad.abs().sum() for p in grads) > 0


def test_without_looping_there_is_no_halting_and_no_ponder_term():
    model = adaptive(loops=1)
    assert model(tokens()).aux == {}
    assert all(layer.router is None and layer.loop_scale is None for layer in model.layers)
    with pytest.raises(ValueError, match="loops=1"):
        model(tokens(), loops=2)


def test_memory_read_every_step_reads_once_per_step():
    calls = []
    model = adaptive(loops=3, memory_slots=4, memory_read="every_step")
    model.layers[0].memory.register_forward_hook(lambda *a: calls.append(1))
    model(tokens())
    assert len(calls) == 3
    calls.clear()
    after = adaptive(loops=3, memory_slots=4)
    after.layers[0].memory.register_forward_hook(lambda *a: calls.append(1))
    after(tokens())
    assert len(calls) == 1


def test_memory_token_prefix_numbers_slots_and_sequence_independently():
    from studyrunner.models.core import CoreParams

    memory = MemoryTokens(CoreParams(d_model=8, n_heads=2), slots=3)
    full, positions = memory.prepend(torch.zeros(2, 5, 8))
    assert full.shape == (2, 8, 8)
    assert positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert torch.equal(memory.strip(full), full[:, 3:])
    # memory rows: vector + memory type; sequence rows: input + sequence type
    torch.testing.assert_close(full[0, :3], memory.vectors + memory.types.weight[1])
    torch.testing.assert_close(full[0, 3:], memory.types.weight[0].expand(5, 8))


@pytest.mark.parametrize("family", ["looped", "ut_act"])
@pytest.mark.parametrize("causal", [True, False])
def test_memory_tokens_are_read_and_attention_quadrants_sum_to_one(family, causal):
    facts = SimpleNamespace(vocab_size=7, seq_len=10, causal=causal)
    torch.manual_seed(0)
    params = {"d_model": 16, "n_heads": 2, "loops": 2, "memory_slots": 4, "pos": "rope"}
    model = build_model(family, params, facts).eval()
    out = model(tokens(), diagnose=True)
    assert out.logits.shape == (3, 10, 7)  # memory outputs dropped before the head
    d = out.diagnostics
    assert d["attn_seq_to_mem"] + d["attn_seq_to_seq"] == pytest.approx(1)
    assert d["attn_mem_to_mem"] + d["attn_mem_to_seq"] == pytest.approx(1)
    assert 0 < d["attn_seq_to_mem"] < 1
    if causal:
        assert d["attn_mem_to_seq"] == 0  # the prefix sees no sequence token under a causal mask
    # the memory vectors matter
    with torch.no_grad():
        model.memory.vectors.add_(torch.randn_like(model.memory.vectors))
    assert not torch.allclose(model(tokens()).logits, out.logits)


def test_attention_mass_matches_an_explicit_softmax():
    probe = AttentionMass(slots=2)
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    probe(q, k, False)
    a = (q @ k.transpose(-1, -2) / 8**0.5).softmax(-1)[0, 0]
    assert probe.result()["attn_seq_to_mem"] == pytest.approx(a[2:, :2].sum(-1).mean().item())
    # probing() attaches the probe to every attention layer and removes it afterwards
    model = build_model("looped", {"d_model": 16, "n_heads": 2, "block_layers": 2}, FACTS)
    with probing(model, probe):
        assert all(b.attn.probe is probe for b in model.blocks)
    assert all(b.attn.probe is None for b in model.blocks)
