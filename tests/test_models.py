"""The shared core and the `looped` family (seed 002 identities)."""

from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from studyrunner.models import build_model, count_params, get_family

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
    torch.testing.assert_close(shared(tokens).logits, deep(tokens).logits, rtol=0, atol=1e-6)
    # and a different loop count really computes something else
    assert not torch.allclose(shared(tokens).logits, looped(facts, block_layers=k, loops=1, pos=pos)(tokens).logits)


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_causal_attention_ignores_later_tokens_and_bidirectional_does_not(pos):
    tokens = torch.randint(0, 7, (2, 10))
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 7
    causal = looped(pos=pos, loops=2).eval()
    torch.testing.assert_close(causal(tokens).logits[:, :-1], causal(changed).logits[:, :-1])
    bidir = looped(SimpleNamespace(vocab_size=7, seq_len=10, causal=False), pos=pos, loops=2).eval()
    assert not torch.allclose(bidir(tokens).logits[:, :-1], bidir(changed).logits[:, :-1])


def test_output_contract():
    out = looped(loops=3)(torch.randint(0, 7, (4, 9)))
    assert out.logits.shape == (4, 9, 7)
    assert out.aux_loss.shape == () and out.aux_loss.item() == 0
    assert isinstance(out.diagnostics, dict)


def test_embeddings_start_small():
    # nn.Embedding's default std of 1 swamps learned positions; the notes found this decisive.
    model = looped(init_std=0.02)
    assert model.embed.tokens.weight.std().item() == pytest.approx(0.02, rel=0.2)
    assert model.embed.positions.weight.std().item() == pytest.approx(0.02, rel=0.2)


def test_too_long_input_is_rejected():
    with pytest.raises(ValueError, match="max length"):
        looped()(torch.zeros(1, 11, dtype=torch.long))


@pytest.mark.parametrize("bad", [{"d_model": 30, "n_heads": 4}, {"loops": 0}, {"block_layers": 0},
                                 {"pos": "alibi"}, {"layers": 2}])
def test_bad_params_are_rejected(bad):
    with pytest.raises(ValidationError):
        get_family("looped").params_model.model_validate(bad)
