"""What a study compiles to: cells (a resolved config without the seed), trials (cell x seed) and the
compiled study that holds them (compiler.py makes them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .schema import Study


@dataclass(frozen=True)
class Cell:
    cell_hash: str
    config: dict[str, Any]  # resolved {task, model, train, eval}
    overrides: dict[str, Any]  # axis path -> value that makes this cell
    label: str
    # (kind, looped cell_hash) for every looped cell this cell is a matched baseline of (`baselines:`)
    baseline_of: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Trial:
    trial_key: str
    study: str
    cell_hash: str
    seed: int
    config: dict[str, Any]
    label: str


@dataclass(frozen=True)
class CompiledStudy:
    study: Study
    cells: list[Cell]
    trials: list[Trial] = field(default_factory=list)
    # Suspicious but runnable settings, one line each (`file:line: field: message`); shown, never fatal.
    warnings: list[str] = field(default_factory=list)
    # A search study (`search:`): the grid cells its searches run in (the base config alone without a grid).
    # Its `cells` are the configurations suggested so far, which only the ledger knows (orchestrate/feeds/search.py).
    bases: list[Cell] = field(default_factory=list)

    @property
    def axes(self) -> list[str]:
        """Varied paths, in file order (the paths `include` entries set last)."""
        paths = list(self.study.grid) + [p for group in self.study.zip for p in group]
        return paths + list(dict.fromkeys(p for extra in self.study.include for p in extra if p not in paths))
