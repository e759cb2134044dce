"""A named registry (pure Python): model families and tasks are both one of these."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

E = TypeVar("E")


class Registry(Generic[E]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, E] = {}

    def add(self, name: str, entry: E) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = entry

    def get(self, name: str) -> E:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._entries))}") from None

    def items(self) -> list[tuple[str, E]]:
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
