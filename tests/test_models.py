"""The shared core and the `looped` family (seed 002 identities)."""

import math
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from studyrunner.models import build_model, count_params, get_family
from studyrunner.models.core import ResidualProj, Rotary

FACTS = SimpleNamespace(vocab_size=7, seq_len=10, causal=True)


def looped(facts=FACTS, **params):
    torch.manual_seed(0)
    return build_model("looped", {"d_model": 32, "n_heads": 4, **params}, facts)


@pytest.mark.parametrize("k,loops", [(1, 4), (2, 3)])
def test_looping_adds_no_parameters(k, loops):
    assert count_params(looped(block_layers=k, loops=loops)) == count_params(looped(block_layers=k, loops=1))
    assert count_params(looped(block_layers=k * loops)) > count_params(looped(block_layers=k))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_k_by_l_equals_unlooped_model_holding_copies_of_the_shared_block(causal, pos):
    facts = SimpleNamespace(vocab_size=7, seq_len=10, causal=causal)
    k, loops = 2, 3
    shared = looped(facts, block_layers=k, loops=loops, pos=pos).eval()
    deep = looped(facts, block_layers=k * loops, loops=1, pos=pos).eval()
    deep.embed.load_state_dict(shared.embed.state_dict())
    deep.head.load_state_dict(shared.head.state_dict())
    for i, block in enumerate(deep.blocks):
        block.load_state_dict(shared.blocks[i % k].state_dict())
    tokens = torch.randint(0, 7, (3, 10))
    assert shared.effective_depth == deep.effective_depth == k * loops
    # Same operations in the same order on the same weights: bit-identical, not merely close.
    assert torch.equal(shared(tokens).logits, deep(tokens).logits)
    # and a different loop count really computes something else
    once = looped(facts, block_layers=k, loops=1, pos=pos).eval()
    assert not torch.allclose(shared(tokens).logits, once(tokens).logits)


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_causal_attention_ignores_later_tokens_and_bidirectional_does_not(pos):
    tokens = torch.randint(0, 7, (2, 10))
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 7
    causal = looped(pos=pos, loops=2).eval()
    torch.testing.assert_close(causal(tokens).logits[:, :-1], causal(changed).logits[:, :-1])
    bidir = looped(SimpleNamespace(vocab_size=7, seq_len=10, causal=False), pos=pos, loops=2).eval()
    assert not torch.allclose(bidir(tokens).logits[:, :-1], bidir(changed).logits[:, :-1])


def test_rope_scores_depend_only_on_relative_position():
    rot = Rotary(head_dim=8, max_len=12, base=100.0)
    q, k = torch.randn(8), torch.randn(8)

    def score(i, j):  # query at position i, key at position j, in the (B, T, H, D) layout
        qs, ks = torch.zeros(1, 12, 1, 8), torch.zeros(1, 12, 1, 8)
        qs[0, i, 0], ks[0, j, 0] = q, k
        return (rot(qs)[0, i, 0] @ rot(ks)[0, j, 0]).item()

    assert score(5, 2) == pytest.approx(score(9, 6), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)
    assert score(0, 0) == pytest.approx((q @ k).item(), abs=1e-5)  # position 0 is the identity


def test_output_contract():
    model = looped(block_layers=2, loops=3)
    assert model.effective_depth == 6 and isinstance(model.effective_depth, int)
    out = model(torch.randint(0, 7, (4, 9)))
    assert out.logits.shape == (4, 9, 7)
    assert out.aux == {}  # no auxiliary terms without the regulariser
    assert out.diagnostics == {}


def test_embeddings_start_small():
    # nn.Embedding's default std of 1 swamps learned positions; the notes found this decisive.
    model = looped(init_std=0.02)
    assert model.embed.tokens.weight.std().item() == pytest.approx(0.02, rel=0.2)
    assert model.embed.positions.weight.std().item() == pytest.approx(0.02, rel=0.2)


def test_gpt2_init_shrinks_residual_projections_with_effective_depth():
    torch.manual_seed(0)
    model = build_model("looped", {"d_model": 128, "n_heads": 4, "loops": 8, "linear_init": "gpt2"}, FACTS)
    proj = [m for m in model.modules() if isinstance(m, ResidualProj)]
    assert len(proj) == 2  # attention output and MLP output of the one shared block
    for m in proj:
        assert m.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * 8), rel=0.1)
    assert model.blocks[0].mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_default_init_keeps_torch_linears_and_small_embeddings():
    # The CPU-scale notes' setting: PyTorch's Kaiming-uniform linears (std = 1/sqrt(3*fan_in)).
    model = build_model("looped", {"d_model": 128, "n_heads": 4, "loops": 8}, FACTS)
    assert model.blocks[0].mlp.fc.weight.std().item() == pytest.approx(1 / math.sqrt(3 * 128), rel=0.1)
    assert model.embed.tokens.weight.std().item() == pytest.approx(0.02, rel=0.2)


def test_too_long_input_is_rejected():
    with pytest.raises(ValueError, match="max length"):
        looped()(torch.zeros(1, 11, dtype=torch.long))


@pytest.mark.parametrize(
    "bad",
    [
        {"d_model": 30, "n_heads": 4},
        {"loops": 0},
        {"block_layers": 0},
        {"pos": "alibi"},
        {"norm": "batchnorm"},
        {"dropout": 1.0},
        {"d_model": 36, "n_heads": 4, "pos": "rope"},
        {"layers": 2},
    ],
)
def test_bad_params_are_rejected(bad):
    with pytest.raises(ValidationError):
        get_family("looped").params_model.model_validate(bad)


def test_divisibility_error_names_the_fields():
    with pytest.raises(ValidationError, match="divisible by n_heads"):
        get_family("looped").params_model.model_validate({"d_model": 30, "n_heads": 4})


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("bias", [False, True])
def test_variants_train(norm, bias):
    model = looped(norm=norm, bias=bias, loops=2, dropout=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 7, (8, 10))
    losses = []
    for _ in range(30):
        out = model(tokens)
        loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), tokens.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
