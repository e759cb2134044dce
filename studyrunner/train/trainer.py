"""Train one trial from its resolved config. Knows models and tasks; nothing of Ray, MLflow or SQL.

Metric names are the product's vocabulary (see README): train_loss, eval_loss, eval_accuracy,
eval_exact_match, params, effective_depth, tokens_per_sec, step_time_ms, plus per-split suffixes
(eval_accuracy_n8) and whatever diagnostics the model family returns.

The family stays unnamed here: the model returns raw auxiliary terms by name (weighted by
`schedules.aux_weights`, logged as train_{term} and {term}_weight), may name parameter groups
whose gradient norm is worth watching (`grad_norm_groups()`, logged as {group}_grad_norm), and
fills its diagnostics when evaluated (`forward(..., diagnose=True)`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch

from ..models import build_model, count_params
from ..tasks import Batch, Task, build_task
from .optim import lr_at, make_optimizer
from .reporter import MemoryReporter, Reporter
from .schedules import aux_weights

EVAL_CHUNK = 256  # examples per eval forward: bounds memory for long sequences
# halt_collapsed = 1 when the final mean halting depth is below this fraction of the loops (the
# shallow-halt trap of seed 003: trapped runs halt at 5-7 of 18 steps, healthy ones at 11-18).
HALT_COLLAPSE_FRACTION = 0.5


def _grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, task: Task, splits: dict[str, Batch], loops: int | None = None
) -> dict[str, float]:
    """Loss, accuracy, exact match (and model diagnostics) per split; unsuffixed names are split means.

    `loops` evaluates at another depth than trained (test-time depth); diagnostics are then skipped."""
    was_training = model.training
    model.eval()
    out: dict[str, float] = {}
    totals: dict[str, list[float]] = defaultdict(list)
    diagnostics: dict[str, list[float]] = defaultdict(list)
    for split, data in splits.items():
        sums: dict[str, float] = defaultdict(float)
        for start in range(0, len(data), EVAL_CHUNK):
            chunk = data.slice(start, start + EVAL_CHUNK)
            result = model(chunk.inputs, loops=loops, diagnose=loops is None)
            n = len(chunk)
            sums["loss"] += task.loss(result.logits, chunk).item() * n
            for name, value in task.metrics(result.logits, chunk).items():
                sums[name] += value * n
            for name, value in result.diagnostics.items():
                diagnostics[name].append(float(value))
        suffix = f"_{split}" if split else ""
        for name, total in sums.items():
            value = total / len(data)
            out[f"eval_{name}{suffix}"] = value
            totals[name].append(value)
    # The unsuffixed names always exist (the split mean), so a study's metric does not depend on how
    # many splits its task has.
    out.update({f"eval_{name}": sum(v) / len(v) for name, v in totals.items()})
    out.update({name: sum(v) / len(v) for name, v in diagnostics.items()})
    model.train(was_training)
    return out


def run_trial(config: dict[str, Any], seed: int, reporter: Reporter | None = None) -> dict[str, float]:
    """Train and evaluate one (cell config, seed); report records as it goes; return final metrics.

    On CPU the same (config, seed, thread count) gives the same final metrics.
    """
    reporter = reporter or MemoryReporter()
    train, ev = config["train"], config["eval"]
    torch.manual_seed(seed)
    task = build_task(config["task"]["name"], config["task"]["params"], seed)
    model = build_model(config["model"]["family"], config["model"]["params"], task.facts)
    optimizer = make_optimizer(model, train["lr"], train["weight_decay"], tuple(train["betas"]))
    splits = task.eval_sets(ev["examples"])
    static = {"params": float(count_params(model)), "effective_depth": float(model.effective_depth)}
    reporter.log(0, dict(static))

    steps, batch_size = train["steps"], train["batch_size"]
    grad_groups = model.grad_norm_groups() if hasattr(model, "grad_norm_groups") else {}
    # Train-window sums of the raw aux terms and watched gradient norms, kept as tensors (no sync per step).
    window_aux: dict[str, torch.Tensor] = {}
    window_grad: dict[str, torch.Tensor] = {}
    weights: dict[str, float] = {}
    window_loss, window_time, window_steps = 0.0, 0.0, 0
    total_time, total_tokens = 0.0, 0
    last: dict[str, float] = {}
    model.train()
    for step in range(steps):
        started = time.perf_counter()
        lr = lr_at(
            step, lr=train["lr"], steps=steps, warmup_steps=train["warmup_steps"], min_lr_ratio=train["min_lr_ratio"]
        )
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = task.train_batch(step, batch_size)
        result = model(batch.inputs)
        loss = task.loss(result.logits, batch)
        weights = aux_weights(step, train, result.aux)
        for name, term in result.aux.items():
            loss = loss + weights[name] * term
            window_aux[name] = window_aux.get(name, 0.0) + term.detach()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for name, params in grad_groups.items():  # before clipping: the gradient the loss asked for
            window_grad[name] = window_grad.get(name, 0.0) + _grad_norm(params)
        if train["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
        optimizer.step()
        loss_value = loss.item()
        if loss_value != loss_value:  # NaN: the trial has diverged; fail it loudly
            raise FloatingPointError(f"train loss is NaN at step {step + 1}")
        elapsed = time.perf_counter() - started
        window_loss, window_time, window_steps = window_loss + loss_value, window_time + elapsed, window_steps + 1
        total_time, total_tokens = total_time + elapsed, total_tokens + batch.inputs.numel()

        done = step + 1
        record: dict[str, float] = {}
        if done % train["log_every"] == 0 or done == steps:
            record.update(
                train_loss=window_loss / window_steps,
                lr=lr,
                step_time_ms=1000 * window_time / window_steps,
                tokens_per_sec=batch.inputs.numel() * window_steps / window_time,
            )
            for name, total in window_aux.items():
                record[f"train_{name}"] = float(total) / window_steps
                record[f"{name}_weight"] = weights[name]
            record.update({f"{name}_grad_norm": float(total) / window_steps for name, total in window_grad.items()})
            window_loss, window_time, window_steps = 0.0, 0.0, 0
            window_aux, window_grad = {}, {}
        if done % ev["every"] == 0 or done == steps:
            record.update(evaluate(model, task, splits))
        if done == steps:
            for n in ev.get("loops") or []:  # test-time depth, once, on the trained model
                at_depth = evaluate(model, task, splits, loops=n)
                record.update({f"{name}_loops_{n}": value for name, value in at_depth.items()})
        if record:
            last.update(record)
            reporter.log(done, record)

    final = {
        **last,
        **static,
        "step_time_ms": 1000 * total_time / steps,
        "tokens_per_sec": total_tokens / total_time,
        "train_time_s": total_time,
    }
    final.pop("lr", None)
    if "ponder_steps_fraction" in last:  # a halting model: did its halting depth collapse?
        threshold = ev.get("halt_collapse_fraction") or HALT_COLLAPSE_FRACTION
        final["halt_collapsed"] = float(last["ponder_steps_fraction"] < threshold)
    return final
