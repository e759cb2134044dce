"""An entry of the study file's `claims:`: a claim in the claims grammar (claims_grammar.py), as a string or
as a mapping with its smallest effect of interest, its margin (equivalence, non-inferiority) and the properties
both sides must match."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from .claims_grammar import parse_claim
from .sections import Strict

MATCHABLE = ("params", "flops", "steps", "lr")  # what `matched:` may name


class ClaimEntry(Strict):
    """One entry of `claims:`: a claim in the claims grammar, and optionally its smallest effect of interest.

    Written as a plain string (`"a[x=1] > a[x=0]"`) or as a mapping (`{claim: "a[x=1] > a[x=0]",
    min_effect: 0.05}`); a string is the mapping without `min_effect`, and an entry without one is written
    back as a string. `min_effect` (> 0) is on the claim's own scale: a difference of the metric, a slope
    per unit of x (per ln x for `ln x`), a difference of failure rates. `verify` gives the seeds its test
    needs to detect that effect with 80% power (`studyrunner.analysis.claims.power`).

    `margin` (> 0, on the claim's scale) turns `A ~= B` into an equivalence claim (decided by two one-sided
    tests: the 1 − 2α interval of A − B inside (−margin, margin)) and `A >= B` / `A <= B` into non-inferiority
    (A is not worse than B by more than the margin); `~=` needs one, `<` and `>` take none (`claims_check`).
    `matched` names the properties both sides must match: params and flops within 10%, steps and lr exactly."""

    claim: str = Field(description="The claim, e.g. 'eval_accuracy[loops=4] > eval_accuracy[loops=1]'.")
    min_effect: float | None = Field(
        None,
        gt=0,
        description="The smallest effect of interest, on the claim's scale (a difference of the metric, a slope "
        "per unit x or per ln x, a difference of failure rates); the seeds needed are given for it.",
    )

    margin: float | None = Field(
        None,
        gt=0,
        description="The equivalence or non-inferiority margin, on the claim's scale: 'A ~= B' is supported when "
        "the 1 - 2*alpha interval of A - B lies inside (-margin, margin); 'A >= B' when its lower bound lies above "
        "-margin (A is not worse than B by more than the margin); 'A <= B' the mirror. Required for ~=.",
    )
    matched: list[str] | None = Field(
        None,
        description="The properties both sides must match: params and flops within 10%, steps and lr exactly "
        f"(any of: {', '.join(MATCHABLE)}).",
    )

    @field_validator("matched")
    @classmethod
    def _known_properties(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        unknown = [n for n in names if n not in MATCHABLE]
        if unknown:
            raise ValueError(
                f"{', '.join(map(repr, unknown))} cannot be matched; give any of {', '.join(MATCHABLE)} (params and "
                "flops within 10%, steps and lr exactly)"
            )
        if len(set(names)) != len(names):
            raise ValueError("each property at most once")
        return names

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        if isinstance(data, ClaimEntry):
            return data
        if isinstance(data, str):
            return {"claim": data}
        if not isinstance(data, dict):
            raise ValueError(
                f"a claim is a string such as 'a[x=1] > a[x=0]' or a mapping {{claim: '...', min_effect: 0.05}}, "
                f"not {type(data).__name__}"
            )
        return data

    @model_validator(mode="after")
    def _parses(self) -> ClaimEntry:
        parse_claim(self.claim)  # a GrammarError (a ValueError) names the position of the problem
        return self

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> Any:
        bare = self.min_effect is None and self.margin is None and self.matched is None
        return self.claim if bare else {k: v for k, v in handler(self).items() if v is not None}

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):
        mapping = handler(core_schema)
        if handler.mode == "serialization":
            return mapping
        text = {"type": "string", "description": "A claim, e.g. 'eval_accuracy[loops=4] > eval_accuracy[loops=1]'."}
        return {"anyOf": [text, mapping]}


def claim_texts(claims) -> list[str]:
    """The texts of a `claims:` list (ClaimEntry, mappings or strings)."""
    return [c.claim if isinstance(c, ClaimEntry) else c["claim"] if isinstance(c, dict) else str(c) for c in claims]
