"""The study file's `seeds:`: a list of seeds, or a sequential design that adds seeds in waves until the
study's claims are decided."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from .sections import Strict

MAX_SEED = 2**31 - 1  # the ledger's INTEGER column on PostgreSQL is 32-bit
MAX_SEQUENTIAL_SEEDS = 1000  # seeds a cell may reach under `seeds: {start, max}`; beyond it a fixed list says what runs


class SequentialSeeds(Strict):
    """`seeds: {start: 3, max: 12}`: seeds on demand until the study's claims are decided (orchestrate/feeds/waves.py,
    analysis/sequential/). Seeds are 0, 1, 2, ... in order, so a trial's key is the one a `seeds:` list
    holding its seed gives."""

    start: int = Field(
        ge=2, le=MAX_SEQUENTIAL_SEEDS, description="Seeds every cell runs first (0 .. start-1); at least 2."
    )
    max: int = Field(
        ge=2,
        le=MAX_SEQUENTIAL_SEEDS,
        description="The most seeds a cell runs; a claim still undecided at max ends inconclusive.",
    )
    step: int | None = Field(
        None,
        ge=1,
        le=MAX_SEQUENTIAL_SEEDS,
        description="Seeds added per wave to each cell an undecided claim selects; unset: as many as fill the "
        "cluster's free trial slots (at least 1).",
    )
    spending: Literal["obrien_fleming", "pocock"] = Field(
        "obrien_fleming",
        description="Alpha-spending function of the group-sequential design (Lan-DeMets): obrien_fleming spends "
        "little at early looks, pocock evenly.",
    )

    @model_validator(mode="after")
    def _max_not_below_start(self) -> SequentialSeeds:
        if self.max < self.start:
            raise ValueError(f"max ({self.max}) must be at least start ({self.start})")
        return self


def _seeds_kind(value: Any) -> str | None:
    if isinstance(value, dict | SequentialSeeds):
        return "sequential"
    return "list" if isinstance(value, list) else None


SeedsField = Annotated[
    Annotated[list[int], Tag("list")] | Annotated[SequentialSeeds, Tag("sequential")],
    Discriminator(
        _seeds_kind,
        custom_error_type="seeds",
        custom_error_message="give a list of seeds, e.g. [0, 1, 2], or sequential seeds, e.g. {start: 3, max: 12}",
    ),
]
SEEDS_TAGS = ("list", "sequential")  # the union's tags, which error messages leave out of a field's path
