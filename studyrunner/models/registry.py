"""Model family registry: a family is a name, a pydantic params model and a builder.

The builder receives the validated params and the task's facts (an object with `vocab_size`,
`seq_len` and `causal`, normally `studyrunner.tasks.TaskFacts`) and returns an `nn.Module` with:
- `forward(tokens, loops=None, *, diagnose=False) -> ModelOutput`: `loops` runs another depth than
  trained (test-time depth); `diagnose` fills `ModelOutput.diagnostics` (the trainer asks at eval);
- `effective_depth` (int) and `loops` (the trained loop count);
- `diagnostic_names` (set[str]): every metric name the model adds, from `params.metric_names()`;
- optionally `grad_norm_groups() -> {group: [parameters]}`, logged as `{group}_grad_norm`;
- optionally `configure(train, eval)`: called once by the trainer with the resolved `train` and `eval`
  sections, for a family that reads knobs of its own there (LoopFormer: `train.trajectory`);
- a call to `representations.trace_step(self, h)` with the state entering its loop and after every
  loop step, so the evaluator can measure the representation diagnostics of each step (named for
  `params.traced_steps()` steps: `loops` by default).
- optionally, for incremental decoding (when `params.supports_decoding()`): `new_cache()` (a
  `kv_cache.KVCache`), `forward(tokens, kv_cache=cache)` continuing the sequence the cache holds, and
  `kv_bytes_per_token(dtype=...)`, the analytic KV bytes per token;
- optionally `set_train_step(step)` (step-dependent state, called before each training step) and
  `convert_from(teacher)` (a conversion's student: start from and distil from a trained model).
- optionally, for FLOP counting (train/flops.py): `compute_draws()`, where a training forward's compute is
  drawn at random (LoopFormer's short run), and `realised_loops(tokens)`, where a halting model computes
  loop steps it does not use (ut_act's ACT). Every other model is counted as it runs, with no hook.
Several weighted outputs (LoopLM's exits) go in `ModelOutput.exits`: the trainer then minimises the
expected task loss over them.
Params models subclass `core.CoreParams` and declare `aux_terms()` (the keys of ModelOutput.aux a
config returns), which the compiler uses to reject `train.*` weights for terms a config lacks, and
may name groups of parameters (`param_groups()`: name -> parameter-name patterns; `lr_group_names`: every
name the family can have) that `train.lr_groups` gives learning rates of their own (MELT's `gates`).
It must build on `torch.device("meta")` (how `plan` counts parameters).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel
from torch import nn

from ..registry import Registry


class TaskFactsLike(Protocol):
    vocab_size: int
    seq_len: int
    causal: bool


FamilyBuilder = Callable[[BaseModel, TaskFactsLike], nn.Module]


@dataclass(frozen=True)
class FamilyEntry:
    name: str
    params_model: type[BaseModel]
    builder: FamilyBuilder


FAMILIES: Registry[FamilyEntry] = Registry("model family")
get_family = FAMILIES.get


def register_family(name: str, params_model: type[BaseModel]) -> Callable[[FamilyBuilder], FamilyBuilder]:
    def decorator(builder: FamilyBuilder) -> FamilyBuilder:
        FAMILIES.add(name, FamilyEntry(name, params_model, builder))
        return builder

    return decorator


def build_model(family: str, params: dict | BaseModel, facts: TaskFactsLike) -> nn.Module:
    entry = get_family(family)
    if not isinstance(params, entry.params_model):
        params = entry.params_model.model_validate(params)
    return entry.builder(params, facts)


def count_params(model: nn.Module) -> int:
    """Distinct trainable parameters: a weight shared across loops counts once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
