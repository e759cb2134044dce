"""Which trials `studyrunner rerun` runs again."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import StudyrunnerError
from ...store import Ledger
from ...study import CompiledStudy


def _spans(seeds: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts: list[str] = []
    for seed in seeds:
        if parts and seed == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{seed}"
        else:
            parts.append(str(seed))
    return ", ".join(parts) or "none registered"


@dataclass(frozen=True)
class RerunSelection:
    """Status filters are alternatives (any may match); `seeds` and `cells` narrow them. No status
    filter at all means every trial not succeeded. `fresh` discards checkpoints (start from step 0)."""

    failed: bool = False
    diverged: bool = False
    missing: bool = False  # never ran: pending with no attempt, or new in the study file
    stale: bool = False  # held by a submit that died
    cancelled: bool = False
    seeds: tuple[int, ...] = ()
    cells: tuple[str, ...] = ()  # cell_hash prefixes
    fresh: bool = False

    def describe(self) -> str:
        parts = [n for n in ("failed", "diverged", "missing", "stale", "cancelled") if getattr(self, n)]
        text = " or ".join(parts) or "not succeeded"
        if self.seeds:
            text += f"; seeds {', '.join(map(str, self.seeds))}"
        if self.cells:
            text += f"; cells {', '.join(self.cells)}"
        return text + ("; from step 0" if self.fresh else "")

    def keys(self, ledger: Ledger, compiled: CompiledStudy, stale_after: float) -> list[str]:
        study = compiled.study.name
        rows = ledger.trials(study, [t.trial_key for t in compiled.trials])
        stale = ledger.stale_keys(study, stale_after) if self.stale else set()
        known = {c.cell_hash for c in compiled.cells}
        for prefix in self.cells:
            if not any(h.startswith(prefix) for h in known):
                raise StudyrunnerError(f"--cell {prefix}: no cell of study {study!r} has a hash starting so")
        seeds = {r.seed for r in rows}  # registered: a sequential study's are those its waves added
        for seed in self.seeds:
            if seed not in seeds:
                raise StudyrunnerError(f"--seeds: {seed} is not a seed of study {study!r} ({_spans(sorted(seeds))})")
        any_status = not (self.failed or self.diverged or self.missing or self.stale or self.cancelled)
        chosen = []
        for r in rows:
            wanted = (
                (any_status and r.status != "succeeded")
                or (self.failed and r.status == "failed")
                or (self.diverged and r.status == "diverged")
                or (self.cancelled and r.status == "cancelled")
                or (self.missing and r.status == "pending" and r.attempts == 0)
                or r.trial_key in stale
            )
            if self.seeds and r.seed not in self.seeds:
                wanted = False
            if self.cells and not any(r.cell_hash.startswith(p) for p in self.cells):
                wanted = False
            if wanted:
                chosen.append(r.trial_key)
        return chosen
