"""The decoding evaluation: held-out examples run token by token through the model's KV cache.

For a task that asks for it (`Task.decodes`) and a family that decodes (`new_cache()`, `forward(tokens,
kv_cache=...)`), once, at the final evaluation. Each example is fed one token at a time from its first:
every position's logits come from attention over the cache, exactly as a served model generates. Where
`Task.decode_feedback` is set (answers generated, e.g. associative recall) the greedy prediction at a
scored position replaces the next input, so a wrong answer stays in the context; otherwise the true
text is streamed (language modelling, whose scores then equal the teacher-forced ones).

What it reports (names in `Task.decode_metric_names`):
- `eval_decode_{loss, accuracy, ...}`: the task's metrics of the decoded logits;
- `kv_cache_bytes_per_token`: measured, the bytes the cache's tensors hold after decoding divided by
  the tokens decoded (batch x positions), beside `kv_cache_bytes_per_token_analytic`, the family's
  count (rows x 2 x d x bytes per element of the compute dtype: 2 under `train.precision: bf16`), and
  `kv_cache_bytes` (the whole cache of the decoded batch);
- `eval_peak_memory_bytes`: peak memory while decoding: on CUDA the allocator's peak
  (`torch.cuda.max_memory_allocated`); on a CPU the process's peak resident set size sampled every
  millisecond from /proc/self/statm (weights, data and the Python process included; 0 where there is
  no /proc);
- `decode_tokens_per_sec`.

A trial of a family with a KV cache on a causal task without a decoding evaluation (p-hop, var_assign, ...)
reports the analytic figure under both names, `kv_cache_bytes_per_token` and
`kv_cache_bytes_per_token_analytic` (`kv_footprint`): the family's count from the model's shape (layers,
loops, heads x head dim = d_model, the compute dtype; MELT's one cache shared by every loop), which a decoding
task's measured figure equals (tests check it), so every trial of such a family can be compared on it.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Any

import torch

from ..tasks import Batch, Task
from .hooks import Decoder, KeepsKVCache

DECODE_EXAMPLES = 256  # examples decoded (the first of the eval split): the cache holds them all at once


def decodes(model: torch.nn.Module, task: Task) -> bool:
    """Does this (model, task) get a decoding evaluation? The task asks, the family can."""
    params = getattr(model, "p", None)
    can = isinstance(model, Decoder) and (params is None or params.supports_decoding())
    return task.decodes and can


def has_kv_cache(model: torch.nn.Module, task: Task) -> bool:
    """Would this model keep a KV cache serving this task: a family that decodes with one (`kv_bytes_per_token`),
    on a causal task (a bidirectional encoder's keys change with every later token, so it keeps none)."""
    params = getattr(model, "p", None)
    can = isinstance(model, KeepsKVCache) and (params is None or params.supports_decoding())
    return can and task.facts.causal


def kv_footprint(model: torch.nn.Module) -> dict[str, float]:
    """The analytic KV cache bytes per token under both names, for a trial without a decoding evaluation."""
    device = next(model.parameters()).device
    per_token = float(model.kv_bytes_per_token(dtype=compute_dtype(model, device)))
    return {"kv_cache_bytes_per_token": per_token, "kv_cache_bytes_per_token_analytic": per_token}


@torch.no_grad()
def decode(model: torch.nn.Module, batch: Batch, feedback: bool) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Logits (B, T, V) of every position decoded one token at a time, the inputs as fed (predictions
    at scored positions when `feedback`), and the cache after the last token."""
    inputs = batch.inputs.clone()
    cache = model.new_cache()
    steps = []
    for i in range(inputs.shape[1]):
        logits = model(inputs[:, i : i + 1], kv_cache=cache).logits[:, 0]
        steps.append(logits)
        if feedback and i + 1 < inputs.shape[1]:
            scored = batch.loss_mask[:, i]
            inputs[:, i + 1] = torch.where(scored, logits.argmax(-1), inputs[:, i + 1])
    return torch.stack(steps, dim=1), inputs, cache


def decoding_eval(model: torch.nn.Module, task: Task, splits: dict[str, Batch]) -> dict[str, float]:
    """The decoding metrics on the first split's first DECODE_EXAMPLES examples."""
    was_training = model.training
    model.eval()
    batch = next(iter(splits.values()))
    batch = batch.slice(0, min(len(batch), DECODE_EXAMPLES))
    device = batch.inputs.device
    with peak_memory(device) as peak:
        started = time.perf_counter()
        logits, fed, cache = decode(model, batch, task.decode_feedback)
        elapsed = time.perf_counter() - started
    decoded = Batch(fed, batch.targets, batch.loss_mask)
    tokens = batch.inputs.numel()
    kv_bytes = cache.nbytes()
    out = {"eval_decode_loss": task.loss(logits, decoded).item()}
    out.update({f"eval_decode_{name}": value for name, value in task.metrics(logits, decoded).items()})
    out.update(
        kv_cache_bytes=float(kv_bytes),
        kv_cache_bytes_per_token=kv_bytes / tokens,
        kv_cache_bytes_per_token_analytic=float(model.kv_bytes_per_token(dtype=compute_dtype(model, device))),
        eval_peak_memory_bytes=float(peak["bytes"]),
        decode_tokens_per_sec=tokens / elapsed if elapsed > 0 else 0.0,
    )
    model.train(was_training)
    return out


def compute_dtype(model: torch.nn.Module, device: torch.device) -> torch.dtype:
    """The dtype keys and values are computed in: autocast's (train.precision: bf16), else the weights'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return next(model.parameters()).dtype


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@contextmanager
def peak_memory(device: torch.device):
    """Yields a dict whose "bytes" is, after the block, the peak memory during it (see the module doc)."""
    result = {"bytes": 0}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        torch.cuda.synchronize(device)
        result["bytes"] = torch.cuda.max_memory_allocated(device)
        return
    stop = threading.Event()
    peak = [_rss_bytes()]

    def sample() -> None:
        while not stop.wait(0.001):
            peak[0] = max(peak[0], _rss_bytes())

    sampler = threading.Thread(target=sample, name="peak-rss", daemon=True)
    sampler.start()
    try:
        yield result
    finally:
        stop.set()
        sampler.join()
        result["bytes"] = max(peak[0], _rss_bytes())
