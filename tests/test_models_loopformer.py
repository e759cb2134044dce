"""LoopFormer: AdaLN-Zero identity at init, trajectories and samplers, budgets
that run exactly M steps, the objectives' extra runs, and Base-Loop = the `looped` family."""

import math
from types import SimpleNamespace

import pytest
import torch

from studyrunner.models import build_model, count_params
from studyrunner.models.conditioning import ModulatedBlock
from studyrunner.models.core import Block
from studyrunner.models.trajectories import (
    front_loading,
    grid_compositions,
    grid_label,
    grid_trajectories,
    parse_spec,
    sample_shortcut,
    schedule,
    start_times,
)

FACTS = SimpleNamespace(vocab_size=7, seq_len=10, causal=True)


def loopformer(**params):
    torch.manual_seed(0)
    return build_model("loopformer", {"d_model": 16, "n_heads": 2, "loops": 4, **params}, FACTS)


def tokens(n=3):
    torch.manual_seed(1)
    return torch.randint(0, 7, (n, 10))


def final_state(model, x, steps):
    """The normed final hidden state along `steps` (what the consistency term compares)."""
    h, _ = model._run(model.embed(x), model._modulations(steps, x.device), len(steps), trace=False)
    return model.head.norm(h)


def block_calls(model):
    calls = []
    for module in model.modules():
        if isinstance(module, Block | ModulatedBlock):
            module.register_forward_pre_hook(lambda m, a: calls.append(m))
    return calls


# ------------------------------------------------------------------------------ AdaLN-Zero identity


@pytest.mark.parametrize("conditioning", ["time_step", "loop_index"])
def test_zero_initialised_block_is_the_identity(conditioning):
    model = loopformer(conditioning=conditioning, block_layers=2).eval()
    x = torch.randn(2, 10, 16)
    c = torch.randn(3, 16)
    for block in model.blocks:
        mods = block.modulator(c)
        assert all(torch.equal(m, torch.zeros_like(m)) for m in mods)
        assert torch.equal(block(x, tuple(m[1] for m in mods)), x)
    # the whole loop is then the identity, at any budget and along any trajectory
    h0 = model.embed(tokens())
    expected = model.head(h0)
    for out in (model(tokens()), model(tokens(), loops=7), model(tokens(), trajectory=[0.125, 0.5, 0.375])):
        assert torch.equal(out.logits, expected)


def test_the_official_codes_effective_init_is_not_the_identity():
    model = loopformer(modulator_init="normal").eval()
    assert not torch.equal(model(tokens()).logits, model.head(model.embed(tokens())))


def test_closed_gates_still_learn():
    model = loopformer()
    out = model(tokens())
    torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), tokens().flatten()).backward()
    gate = model.blocks[0].modulator.linear
    assert gate.weight.grad.abs().sum() > 0  # gradient reaches the modulator through the closed gates
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() == 0  # and nothing else of the block, yet


# ------------------------------------------------------------------------------ trajectories


@pytest.mark.parametrize("spec", ["uniform", "front_loaded", "back_loaded", {"geometric": 0.5}, {"geometric": 3.0}])
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_schedules_sum_to_one_with_m_positive_steps(spec, m):
    steps = schedule(spec, m)
    assert len(steps) == m and all(s > 0 for s in steps)
    assert math.fsum(steps) == pytest.approx(1.0, abs=1e-12)


def test_schedule_shapes():
    assert schedule("uniform", 4) == [0.25] * 4
    front, back = schedule("front_loaded", 4), schedule("back_loaded", 4)
    assert front == sorted(front, reverse=True) and back == list(reversed(front))
    assert schedule({"geometric": 0.5}, 3) == pytest.approx([4 / 7, 2 / 7, 1 / 7])
    assert schedule({"geometric": 1.0}, 5) == pytest.approx(schedule("uniform", 5))
    assert start_times([0.5, 0.25, 0.25]) == [0.0, 0.5, 0.75]
    assert front_loading([1.0]) == front_loading([0.25] * 4) == 0.5
    assert front_loading(front) > 0.5 > front_loading(back)


def test_enumerate_all_is_every_composition_on_the_grid():
    trajectories = grid_trajectories(8, 4)
    assert len(trajectories) == math.comb(7, 3) == 35  # the paper's L = 8, M = 4
    assert len({tuple(t) for t in trajectories}) == 35
    for steps in trajectories:
        assert len(steps) == 4 and math.fsum(steps) == 1.0
        assert all((s * 8).is_integer() and s > 0 for s in steps)
    assert grid_label([0.5, 0.25, 0.125, 0.125], 8) == "4_2_1_1"
    assert list(grid_compositions(3, 4)) == []


@pytest.mark.parametrize("sampler", ["grid_composition", "grid_sequential", "dirichlet"])
def test_sampled_shortcuts_sum_to_one_and_lie_on_the_grid_when_asked(sampler):
    torch.manual_seed(0)
    lengths = set()
    for _ in range(300):
        steps = sample_shortcut(sampler, 8, 7)
        lengths.add(len(steps))
        assert 1 <= len(steps) <= 7 and all(s > 0 for s in steps)
        assert math.fsum(steps) == pytest.approx(1.0, abs=1e-12)
        on_grid = all(math.isclose(s * 8, round(s * 8), abs_tol=1e-9) for s in steps)
        assert on_grid or sampler == "dirichlet"
    assert lengths == set(range(1, 8))  # S ~ U{1..L-1}: every length appears


def test_grid_composition_is_uniform_over_compositions_and_sequential_is_not():
    torch.manual_seed(0)
    counts = {"grid_composition": {}, "grid_sequential": {}}
    for sampler, seen in counts.items():
        for _ in range(4000):
            steps = sample_shortcut(sampler, 5, 4)
            if len(steps) == 2:  # compositions of 5 into 2: (1,4) (2,3) (3,2) (4,1)
                key = grid_label(steps, 5)
                seen[key] = seen.get(key, 0) + 1
    uniform, sequential = counts["grid_composition"], counts["grid_sequential"]
    assert set(uniform) == set(sequential) == {"1_4", "2_3", "3_2", "4_1"}
    assert max(uniform.values()) < 1.3 * min(uniform.values())
    # with 3 parts the official sampler favours a long first step: P(3,1,1) = 1/3 but P(1,1,3) = 1/9
    torch.manual_seed(0)
    firsts = {}
    for _ in range(4000):
        steps = sample_shortcut("grid_sequential", 5, 4)
        if len(steps) == 3:
            firsts[grid_label(steps, 5)] = firsts.get(grid_label(steps, 5), 0) + 1
    assert firsts["3_1_1"] > 1.5 * firsts["1_1_3"]


def test_spec_parsing_names_the_problem():
    with pytest.raises(ValueError, match="sum to 1"):
        parse_spec([0.5, 0.4], evaluation=False)
    with pytest.raises(ValueError, match="must be positive"):
        parse_spec([1.5, -0.5], evaluation=False)
    with pytest.raises(ValueError, match="eval.trajectory only"):
        parse_spec("enumerate_all", evaluation=False)
    assert parse_spec("enumerate_all", evaluation=True) == "enumerate_all"
    assert parse_spec({"geometric": 2}, evaluation=False) == {"geometric": 2.0}
    with pytest.raises(ValueError, match="geometric ratio"):
        parse_spec({"geometric": 0}, evaluation=False)


# ------------------------------------------------------------------------------ budgets


@pytest.mark.parametrize("conditioning", ["none", "loop_index", "time_step"])
@pytest.mark.parametrize("objective", ["fixed", "early_exit", "shortcut_consistency"])
@pytest.mark.parametrize("m", [1, 2, 4, 7])
def test_budget_m_runs_exactly_m_steps(conditioning, objective, m):
    model = loopformer(conditioning=conditioning, objective=objective, block_layers=2).eval()
    calls = block_calls(model)
    assert model(tokens(), loops=m).logits.shape == (3, 10, 7)
    assert len(calls) == 2 * m
    calls.clear()
    model(tokens(), trajectory=schedule("front_loaded", m))
    assert len(calls) == 2 * m
    calls.clear()
    model(tokens())
    assert len(calls) == 2 * model.loops == 2 * 4


def test_training_forwards_cost_what_the_objective_says():
    for objective, extra in (("fixed", 0), ("early_exit", 0), ("early_exit_consistency", 0)):
        model = loopformer(objective=objective)
        calls = block_calls(model)
        model(tokens())
        assert len(calls) == 4 + extra, objective  # an exit reuses the full run's state: no extra steps
    model = loopformer(objective="shortcut_consistency")
    calls = block_calls(model)
    x = tokens()
    torch.manual_seed(3)
    model(x)
    torch.manual_seed(3)
    short = sample_shortcut(model.p.shortcut_sampler, 4, 3)
    assert len(calls) == 4 + len(short)


def test_budgets_of_an_early_exit_model_exit_its_trained_trajectory():
    model = loopformer(objective="early_exit")
    model.configure({"trajectory": [0.4, 0.3, 0.2, 0.1]}, {})
    assert model.budget(2) == [0.4, 0.3] and model.budget(6) == [0.4, 0.3, 0.2, 0.1, 0.1, 0.1]
    assert loopformer(objective="fixed").budget(3) == schedule("uniform", 3)


def test_the_short_runs_are_the_budget_and_the_sampled_trajectory():
    x = tokens()
    model = loopformer(objective="early_exit_consistency", modulator_init="normal")
    out = model(x)
    model.eval()
    exits = [model(x, loops=s).logits for s in range(1, 4)]
    # the exit after S steps (up to rounding: the conditioning is embedded for 4 steps at once there)
    assert any(torch.allclose(out.aux_logits["shortcut"], e, rtol=1e-5, atol=1e-6) for e in exits)
    assert set(out.aux) == {"consistency"} and out.aux["consistency"] > 0

    model = loopformer(objective="shortcut_consistency", shortcut_sampler="grid_sequential", modulator_init="normal")
    torch.manual_seed(5)
    out = model(x)
    torch.manual_seed(5)
    short = sample_shortcut("grid_sequential", 4, 3)
    model.eval()
    assert torch.equal(out.aux_logits["shortcut"], model(x, trajectory=short).logits)
    hidden = model.head.norm(
        model._run(model.embed(x), model._modulations(short, x.device), len(short), trace=False)[0]
    )
    full = model.head.norm(model._run(model.embed(x), model._modulations([0.25] * 4, x.device), 4, trace=False)[0])
    assert out.aux["consistency"].item() == pytest.approx(torch.nn.functional.mse_loss(hidden, full).item(), rel=1e-6)


def test_consistency_is_one_sided_the_full_run_is_a_detached_teacher():
    """The consistency term's gradient is that of MSE(h_short, constant): nothing flows into the full run."""
    x = tokens()
    model = loopformer(objective="shortcut_consistency", modulator_init="normal")
    torch.manual_seed(5)
    model(x).aux["consistency"].backward()
    through_model = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    torch.manual_seed(5)
    short = sample_shortcut(model.p.shortcut_sampler, 4, 3)
    with torch.no_grad():
        teacher = model.head.norm(
            model._run(model.embed(x), model._modulations([0.25] * 4, x.device), 4, trace=False)[0]
        )
    student = model.head.norm(
        model._run(model.embed(x), model._modulations(short, x.device), len(short), trace=False)[0]
    )
    torch.nn.functional.mse_loss(student, teacher).backward()
    by_hand = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert through_model.keys() == by_hand.keys()
    for name, grad in by_hand.items():
        torch.testing.assert_close(through_model[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_only_time_step_conditioning_sees_the_step_sizes():
    x = tokens()
    for conditioning, differs in (("time_step", True), ("loop_index", False), ("none", False)):
        model = loopformer(conditioning=conditioning, modulator_init="normal").eval()
        a, b = model(x, trajectory=[0.5, 0.5]).logits, model(x, trajectory=[0.125, 0.875]).logits
        assert (not torch.equal(a, b)) == differs, conditioning


def test_bad_trajectories_and_budgets_fail_clearly():
    model = loopformer().eval()
    with pytest.raises(ValueError, match="summing to 1"):
        model(tokens(), trajectory=[0.5, 0.4])
    with pytest.raises(ValueError, match="3 steps"):
        model(tokens(), loops=2, trajectory=[0.5, 0.25, 0.25])
    with pytest.raises(ValueError, match="loops must be >= 1"):
        model(tokens(), loops=0)


# ------------------------------------------------------------------------------ family facts


def test_base_loop_is_the_looped_family():
    """conditioning none + objective fixed builds the same modules in the same order as `looped`: the same
    initial weights and the same logits, bit for bit."""
    core = {"d_model": 16, "n_heads": 2, "norm": "layernorm", "block_layers": 2, "loops": 3}
    torch.manual_seed(0)
    base = build_model("loopformer", {**core, "conditioning": "none", "objective": "fixed"}, FACTS).eval()
    torch.manual_seed(0)
    looped = build_model("looped", core, FACTS).eval()
    assert count_params(base) == count_params(looped)
    assert torch.equal(base(tokens()).logits, looped(tokens()).logits)
    assert torch.equal(base(tokens(), loops=5).logits, looped(tokens(), loops=5).logits)


def test_configure_sets_the_trained_trajectory_and_depth():
    model = loopformer(block_layers=2)
    assert model.loops == 4 and model.effective_depth == 8 and model.trajectory == [0.25] * 4
    model.configure({"trajectory": [0.5, 0.3, 0.2]}, {})
    assert model.loops == 3 and model.effective_depth == 6 and model.trajectory == [0.5, 0.3, 0.2]
    model.configure({"trajectory": "front_loaded"}, {})
    assert model.trajectory == schedule("front_loaded", 4)


def test_declared_names_and_meta_builds():
    for conditioning in ("none", "loop_index", "time_step"):
        model = loopformer(conditioning=conditioning).eval()
        out = model(tokens(), diagnose=True)
        assert set(out.diagnostics) == model.p.diagnostic_names() <= model.diagnostic_names
        assert all(0 <= v for v in out.diagnostics.values())
        with torch.device("meta"):
            meta = loopformer(conditioning=conditioning)
        assert count_params(meta) == count_params(model)
    model = loopformer(objective="shortcut_consistency")
    assert {"train_shortcut", "train_consistency", "shortcut_weight", "consistency_weight"} <= model.diagnostic_names
    assert model.p.aux_terms() == {"shortcut", "consistency"}
    assert loopformer(objective="early_exit").p.aux_terms() == {"shortcut"}
    assert loopformer(objective="fixed").p.aux_terms() == set()


# ------------------------------------------------------------------------------ the same block, no loop time


def test_constant_conditioning_is_loopformers_block_without_loop_time():
    """`conditioning: constant`: the AdaLN-Zero blocks, zero-initialised (identity at the start), whose gates and
    scales are learned constants: the same at every step and trajectory (no loop-time information)."""
    model = loopformer(conditioning="constant", block_layers=2)
    assert all(isinstance(b, ModulatedBlock) for b in model.blocks) and model.time_embed is None
    with torch.no_grad():
        for block in model.blocks:
            block.modulator.linear.bias.uniform_(-0.5, 0.5)
    steps = model._modulations([0.1, 0.2, 0.7], torch.device("cpu"))
    for per_block in steps:
        for mod in per_block:
            assert torch.equal(mod[0], mod[1]) and torch.equal(mod[1], mod[2])  # constant over steps
    assert set(model.p.param_groups()) == {"conditioning"}
    x = tokens()
    assert torch.equal(model(x, trajectory=[0.25] * 4).logits, model(x, trajectory=[0.7, 0.1, 0.1, 0.1]).logits)


def test_a_loopformers_baselines_are_made_of_its_own_blocks():
    params = build_model("loopformer", {"d_model": 16, "n_heads": 2, "loops": 4, "block_layers": 2}, FACTS).p
    for kind, k in (("iso_param", 2), ("iso_flop", 8)):
        family, base = params.baseline(kind)
        assert family == "loopformer" and base["conditioning"] == "constant" and base["objective"] == "fixed"
        assert base["loops"] == 1 and base["block_layers"] == k
        assert all(isinstance(b, ModulatedBlock) for b in build_model(family, base, FACTS).blocks)
