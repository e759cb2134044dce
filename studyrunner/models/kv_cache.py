"""KV caches for incremental decoding, read and written by the core's attention (`Attention.attend_cached`).

A cache is a set of named slots; each slot holds the keys and values (B, H, S, D) of one attention
layer application. Which applications get a slot is the family's memory layout, the quantity seed 001
(MELT) is about:

- `looped`: one slot per block application (prefix, block x loop, suffix);
- `looplm` (Ouro): one slot per (loop, layer), so T * N rows per token: O(N * L * T) bytes;
- `melt`: one slot per layer, shared by every loop: a token's row is appended at its first loop and
  overwritten at each later one (`KVSlot.replace_tail`), so N rows per token: O(N * L) bytes.

Slots grow by concatenation, so the tensors a slot holds are exactly its rows: `KVCache.nbytes()`
measures the cache from its tensors' storage (what `kv_cache_bytes_per_token` reports after decoding),
independently of the analytic count a family declares (`kv_bytes_per_token`), and tests check that the
two agree.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch


class KVSlot:
    """Keys and values of one attention layer application, oldest token first."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' rows; return every row."""
        if self.k is None or self.v is None:
            self.k, self.v = k, v
        else:
            self.k, self.v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def replace_tail(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Overwrite the newest k.shape[2] rows (a token's row updated at a later loop); return every row.

        In place when no gradient flows (decoding); functionally where one may (chunk-wise training), since
        autograd keeps the rows an earlier loop attended to. "May": whenever gradients are enabled, not only
        where a tensor says it requires them, since under torch.func.vmap (packed trials, train/vectorized.py)
        the batched tensors do not say so."""
        if self.k is None or self.v is None or self.k.shape[2] < k.shape[2]:
            raise RuntimeError("replace_tail before the rows it replaces were appended")
        n = k.shape[2]
        if torch.is_grad_enabled():
            self.k = torch.cat([self.k[:, :, :-n], k], dim=2)
            self.v = torch.cat([self.v[:, :, :-n], v], dim=2)
        else:
            self.k[:, :, -n:].copy_(k)
            self.v[:, :, -n:].copy_(v)
        return self.k, self.v

    def detach_(self) -> None:
        if self.k is not None and self.v is not None:
            self.k, self.v = self.k.detach(), self.v.detach()

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.v) if t is not None]


class KVCache:
    """Named slots plus the number of tokens the cache has seen (`length`, the next token's position).

    A family creates one with `model.new_cache()` and passes it to `forward(tokens, kv_cache=cache)`,
    which attends over what the cache holds, adds the new tokens and advances `length`."""

    def __init__(self) -> None:
        self.slots: dict[Hashable, KVSlot] = {}
        self.length = 0

    def slot(self, key: Hashable) -> KVSlot:
        if key not in self.slots:
            self.slots[key] = KVSlot()
        return self.slots[key]

    def nbytes(self) -> int:
        """Bytes of storage the cache's tensors hold (each storage counted once)."""
        seen: dict[int, int] = {}
        for slot in self.slots.values():
            for t in slot.tensors():
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def rows_per_token(self) -> int:
        """Slots holding a row for every token: the layout's K/V rows per token."""
        return sum(1 for slot in self.slots.values() if slot.length)


def kv_bytes_per_token(rows: int, d_model: int, dtype: torch.dtype = torch.float32) -> int:
    """Analytic KV bytes per token: `rows` attention applications that keep a key and a value of width
    d_model each (full multi-head attention, no GQA): rows * 2 * d * bytes per element. Seed 001's
    L * N * 2 * d * bytes * R per sequence of L tokens, divided by L."""
    return rows * 2 * d_model * torch.empty((), dtype=dtype).element_size()
