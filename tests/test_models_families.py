"""Seams every family shares: test-time depth, named aux terms, diagnostic
names, meta-device builds; and the `looped` extensions (middle looping, memory, regulariser)."""

from types import SimpleNamespace

import pytest
import torch

from studyrunner.models import build_model, count_params, get_family
from studyrunner.models.core import Block
from studyrunner.models.regularisers import block_distance, parameter_groups

FACTS = SimpleNamespace(vocab_size=7, seq_len=10, causal=True)

# Small configs of every family, with their mechanisms switched on.
CONFIGS = {
    "looped": {"block_layers": 2, "loops": 3},
    "looped_mem_reg": {"block_layers": 2, "loops": 2, "memory_slots": 3, "regulariser_k": 1, "prefix_layers": 1},
    "ut_act": {"loops": 4, "memory_slots": 2},
    "ut_act_off": {"loops": 4, "memory_slots": 0, "act": False},
    "adaptive_layers": {"n_layers": 2, "loops": 3, "memory_slots": 4, "memory_global_slots": 2},
}


def family_of(name):
    return name.split("_mem")[0].removesuffix("_off")


def build(name, **extra):
    torch.manual_seed(0)
    return build_model(family_of(name), {"d_model": 16, "n_heads": 2, **CONFIGS[name], **extra}, FACTS)


def tokens():
    torch.manual_seed(1)
    return torch.randint(0, 7, (2, 10))


def count_block_calls(model):
    calls = []
    for module in model.modules():
        if isinstance(module, Block):
            module.register_forward_pre_hook(lambda m, a: calls.append(m))
    return calls


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("n", [1, 2, 7])
def test_eval_at_loops_n_runs_exactly_n_steps(name, n):
    model = build(name).eval()
    calls = count_block_calls(model)
    out = model(tokens(), loops=n)
    assert out.logits.shape == (2, 10, 7)
    per_step = {"looped": 2, "looped_mem_reg": 2, "ut_act": 1, "ut_act_off": 1, "adaptive_layers": 2}[name]
    fixed = 1 if name == "looped_mem_reg" else 0  # the prefix layer runs once whatever the loops
    assert len(calls) == per_step * n + fixed
    calls.clear()
    model(tokens())  # the default is the trained depth
    assert len(calls) == per_step * model.loops + fixed


@pytest.mark.parametrize("name", list(CONFIGS))
def test_diagnostics_are_exactly_the_declared_names_and_builds_on_meta(name):
    model = build(name).eval()
    params = get_family(family_of(name)).params_model.model_validate({"d_model": 16, "n_heads": 2, **CONFIGS[name]})
    out = model(tokens(), diagnose=True)
    assert set(out.diagnostics) == params.diagnostic_names()
    assert params.diagnostic_names() <= model.diagnostic_names  # the model's set adds trainer records
    assert set(out.aux) == params.aux_terms()
    assert {f"train_{t}" for t in out.aux} <= model.diagnostic_names
    assert all(isinstance(v, float) for v in out.diagnostics.values())
    assert model(tokens()).diagnostics == {}  # only when asked: training steps pay nothing
    with torch.device("meta"):  # `plan` counts parameters this way
        meta = build(name)
    assert count_params(meta) == count_params(model)
    assert meta.effective_depth == model.effective_depth


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_family_trains_with_its_aux_terms(name):
    model = build(name, dropout=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = tokens()
    losses = []
    for _ in range(25):
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), x.flatten())
        loss = loss + 0.01 * sum(out.aux.values(), torch.zeros(()))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


def test_middle_looping_equals_an_unlooped_stack_holding_copies():
    torch.manual_seed(0)
    params = {"d_model": 16, "n_heads": 2, "prefix_layers": 1, "block_layers": 2, "loops": 3, "suffix_layers": 1}
    middle = build_model("looped", params, FACTS).eval()
    deep = build_model("looped", {"d_model": 16, "n_heads": 2, "block_layers": 8}, FACTS).eval()
    assert middle.effective_depth == deep.effective_depth == 8
    deep.embed.load_state_dict(middle.embed.state_dict())
    deep.head.load_state_dict(middle.head.state_dict())
    order = [middle.prefix[0]] + [middle.blocks[i % 2] for i in range(6)] + [middle.suffix[0]]
    for block, source in zip(deep.blocks, order, strict=True):
        block.load_state_dict(source.state_dict())
    assert torch.equal(middle(tokens()).logits, deep(tokens()).logits)
    # iso-param with a (1 + 2 + 1) x 1 stack
    assert count_params(middle) == count_params(
        build_model("looped", {"d_model": 16, "n_heads": 2, "block_layers": 4}, FACTS)
    )


def test_new_looped_knobs_are_left_out_of_the_dump_at_their_defaults():
    model = get_family("looped").params_model
    plain = model.model_validate({"loops": 2}).model_dump(mode="json")
    explicit = model.model_validate({"loops": 2, "memory_slots": 0, "prefix_layers": 0}).model_dump(mode="json")
    assert plain == explicit
    assert not {"memory_slots", "prefix_layers", "suffix_layers", "regulariser_k"} & set(plain)
    assert model.model_validate({"loops": 2, "memory_slots": 4}).model_dump()["memory_slots"] == 4


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"block_layers": 2, "regulariser_k": 2}, "smaller than block_layers"),
        ({"block_layers": 2, "regulariser_distance": "l2"}, "no effect without regulariser_k"),
        ({"memory_slots": -1}, "greater than or equal"),
    ],
)
def test_bad_looped_extensions_are_rejected(bad, match):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=match):
        get_family("looped").params_model.model_validate(bad)


def test_regulariser_pairs_layer_l_with_l_plus_k_per_group():
    torch.manual_seed(0)
    model = build_model("looped", {"d_model": 16, "n_heads": 2, "block_layers": 4, "regulariser_k": 2}, FACTS)
    groups = parameter_groups(model.blocks[0])
    assert set(groups) == {"attn_q", "attn_k", "attn_v", "attn_proj", "mlp_fc", "mlp_proj"}
    with torch.no_grad():  # make layer 2 a copy of layer 0 and layer 3 the negation of layer 1
        model.blocks[2].load_state_dict(model.blocks[0].state_dict())
        for a, b in zip(model.blocks[3].parameters(), model.blocks[1].parameters(), strict=True):
            a.copy_(-b)
    term, cosines = block_distance(list(model.blocks), 2)
    # pairs (0, 2) -> cos 1 and (1, 3) -> cos -1: mean 0 for every group, term 1 - 0
    for g, c in cosines.items():
        assert c.item() == pytest.approx(0.0, abs=1e-6), g
    assert term.item() == pytest.approx(1.0)
    out = model(tokens(), diagnose=True)
    assert out.aux["regulariser"].item() == pytest.approx(1.0)
    assert out.diagnostics["block_cos_mean"] == pytest.approx(0.0, abs=1e-6)
    l2, _ = block_distance(list(model.blocks), 2, distance="l2")
    assert l2.item() > 0
