"""Halting invariants: Graves ACT and the `ut_act` family (seed 003), PonderNet weights."""

from types import SimpleNamespace

import pytest
import torch

from studyrunner.models import build_model, count_params
from studyrunner.models.halting import ACT, HaltingRouter, PonderNet

FACTS = SimpleNamespace(vocab_size=7, seq_len=10, causal=False)


def ut(**params):
    torch.manual_seed(0)
    base = {"d_model": 16, "n_heads": 2, "loops": 6, "memory_slots": 0}
    return build_model("ut_act", {**base, **params}, FACTS)


def tokens(b=3):
    torch.manual_seed(1)
    return torch.randint(0, 7, (b, 10))


def run_act(probs: torch.Tensor, epsilon=0.05):
    """Drive ACT with given per-step probabilities (S, B, T) and random states; return it and the states."""
    steps, b, t = probs.shape
    act = ACT(probs[0], epsilon, steps)
    h = torch.zeros(b, t, 4)
    states = []
    for n in range(steps):
        h = act.step(probs[n], h, torch.randn(b, t, 4))
        states.append(h)
    return act, states


def test_act_weights_sum_to_one_per_token():
    torch.manual_seed(0)
    act, _ = run_act(torch.rand(7, 4, 5) * 0.6)
    total = torch.stack(act.weights).sum(0)
    torch.testing.assert_close(total, torch.ones(4, 5))
    assert not act.running.any()  # every token has halted, at the latest at the last step
    assert ((act.steps >= 1) & (act.steps <= 7)).all()


def test_act_remainder_goes_to_the_halting_step_and_nothing_after():
    p = torch.tensor([0.3, 0.3, 0.6, 0.9]).view(4, 1, 1)  # cum 0.3, 0.6, 1.2 -> halts at step 3
    act, _ = run_act(p)
    weights = [w.item() for w in act.weights]
    assert weights == pytest.approx([0.3, 0.3, 0.4, 0.0])
    assert act.steps.item() == 3 and act.remainder.item() == pytest.approx(0.4)
    assert act.ponder.item() == pytest.approx(3.4)  # N + R


def test_halted_states_do_not_change():
    torch.manual_seed(0)
    probs = torch.rand(8, 3, 6)
    act, states = run_act(probs)
    halted_at = act.steps.long()  # 1-based halting step per token
    for n in range(8):
        for b in range(3):
            for t in range(6):
                m = halted_at[b, t].item()
                if n + 1 > m:  # after halting, the state is the one it halted with
                    assert torch.equal(states[n][b, t], states[m - 1][b, t])
    assert (halted_at < 8).any()  # some token halted early, so the check above was exercised


def test_ut_act_deep_start_runs_every_step_and_bias_zero_halts_at_step_two():
    # Paper values: 18 steps, epsilon 0.05. -3: cumulative p after 18 steps ~0.85 < 0.95.
    deep = ut(loops=18, halt_bias_init=-3.0, act_epsilon=0.05).eval()
    d = deep(tokens(), diagnose=True).diagnostics
    assert d["ponder_steps_mean"] == 18 and d["ponder_steps_fraction"] == 1
    assert d["halt_weight_step_18"] == pytest.approx(1 - 17 * torch.sigmoid(torch.tensor(-3.0)).item(), abs=1e-5)
    shallow = ut(loops=18, halt_bias_init=0.0).eval()
    s = shallow(tokens(), diagnose=True).diagnostics
    assert s["ponder_steps_mean"] == 2  # p = 0.5: cumulative 0.5, then 1.0 >= 0.95
    assert s["halt_weight_step_1"] == s["halt_weight_step_2"] == 0.5
    assert s["halt_weight_step_3"] == 0


def test_router_gets_a_gradient_from_the_ponder_cost():
    model = ut(loops=6, halt_bias_init=-3.0)
    out = model(tokens())
    out.aux["ponder"].backward()
    router = model.router.linear
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0
    assert router.bias.grad.item() != 0
    # ... and nothing else: the ponder cost is N + R and only R depends on parameters, through p.
    assert model.head.out.weight.grad is None


def test_act_false_outputs_the_last_state():
    model = ut(act=False, loops=4).eval()
    x = tokens()
    h = model.embed(x)
    for n in range(4):
        h = model.block(h + model.step_embed.weight[n])
    torch.testing.assert_close(model(x).logits, model.head(h))
    assert model(x).aux == {} and model.router is None
    # ACT with the router pinned to p ~ 0 gives the same model: all weight on the last step.
    act = ut(act=True, loops=4, halt_bias_init=-30.0).eval()
    missing = act.load_state_dict(model.state_dict(), strict=False).missing_keys
    assert set(missing) == {"router.linear.weight", "router.linear.bias"}
    torch.testing.assert_close(act(x).logits, model(x).logits)


def test_halted_tokens_are_still_attended_with_their_frozen_state():
    model = ut(loops=5, halt_bias_init=0.0).eval()
    torch.manual_seed(3)
    torch.nn.init.normal_(model.router.linear.weight, 0, 2.0)  # tokens now halt at different steps
    inputs, outputs = [], []

    def record(module, args, out):
        inputs.append(args[0])
        outputs.append(out)

    model.block.register_forward_hook(record)
    x = tokens()
    model(x)
    with torch.no_grad():
        act = ACT(torch.zeros(3, 10), 0.05, 5)
        h = model.embed(x)
        for n in range(5):
            h_new = model.block(h + model.step_embed.weight[n])
            h = act.step(model.router(h_new), h, h_new)
    halted_at = act.steps.long()
    assert (halted_at < 5).any() and (halted_at > 1).any()
    for n in range(1, 5):
        for b, t in (halted_at < n + 1).nonzero().tolist():
            m = halted_at[b, t].item()
            # block input at step n+1 = frozen state (its output at its halting step) + step embedding
            torch.testing.assert_close(inputs[n][b, t] - model.step_embed.weight[n], outputs[m - 1][b, t])


def test_step_embedding_wraps_at_test_time_depth():
    model = ut(loops=3).eval()
    used = []
    model.block.register_forward_pre_hook(lambda m, args: used.append(args[0]))
    x = tokens()
    model(x, loops=7)
    assert len(used) == 7
    # step 4 (index 3) reuses step 1's embedding: the input minus the previous state is E[0] again
    h0 = model.embed(x)
    torch.testing.assert_close(used[0] - h0, model.step_embed.weight[0].expand_as(h0))


def test_memory_tokens_halt_too_and_are_dropped_before_the_head():
    model = ut(memory_slots=4, loops=3).eval()
    out = model(tokens(), diagnose=True)
    assert out.logits.shape == (3, 10, 7)
    assert out.diagnostics["ponder_steps_mean_memory"] == 3
    assert out.aux["ponder"].item() == pytest.approx(3 + 1 - 2 * torch.sigmoid(torch.tensor(-3.0)).item(), abs=1e-5)


def test_router_starts_at_zero_weights_and_set_bias_whatever_linear_init():
    for init in ("torch", "gpt2"):
        model = ut(halt_bias_init=-3.0, linear_init=init)
        assert model.router.linear.weight.abs().sum() == 0
        assert model.router.linear.bias.item() == -3.0
    router = HaltingRouter(5, 1.0)
    assert router(torch.randn(2, 3, 5)).allclose(torch.full((2, 3), torch.sigmoid(torch.tensor(1.0)).item()))


def test_pondernet_weights_sum_to_one_with_the_remainder_on_the_last_step():
    torch.manual_seed(0)
    probs = torch.rand(5, 2, 3)
    pn = PonderNet(5, "last")
    for p in probs:
        pn.step(p, torch.randn(2, 3, 4))
    torch.testing.assert_close(torch.stack(pn.weights).sum(0), torch.ones(2, 3))
    expected = sum((t + 1) * w for t, w in enumerate(pn.weights))
    torch.testing.assert_close(pn.expected_steps, expected)
    # the literal reading drops the remainder: weights sum to 1 - prod(1 - p)
    drop = PonderNet(5, "drop")
    for p in probs:
        drop.step(p, torch.randn(2, 3, 4))
    torch.testing.assert_close(torch.stack(drop.weights).sum(0), 1 - (1 - probs).prod(0))
    assert (torch.stack(drop.weights).sum(0) < 1).all()


def test_derf_norm_is_erf_of_an_affine_map_without_gain():
    model = ut(norm="derf")
    norm = model.block.norm1
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(norm(x), torch.erf(norm.alpha * x + norm.shift))
    assert (norm.alpha - 1).abs().max() < 0.2 and norm.shift.abs().sum() == 0
    # a and s per feature, in each of the 3 norms (2 in the block, 1 in the head); LayerNorm without bias has 1
    assert count_params(ut(norm="derf")) - count_params(ut(norm="layernorm")) == 3 * 16
