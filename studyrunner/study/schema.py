"""The study file's schema (pydantic v2). Its top-level shape is the product's interface.

Family and task parameters are plain dicts here; they are validated against the model-family and
task registries when the study is compiled, so a new family or task needs no change to this file.

The top level (`Study`) is here; its sections are in modules of their own, whose names are re-exported
below so that `from studyrunner.study.schema import ...` finds every one: sections.py (task, model, eval,
resources, metric, analysis, and the base they share), train_section.py, seeds.py, claim_entries.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PrivateAttr, field_validator, model_validator

from ..params import _prepare
from .claim_entries import ClaimEntry, claim_texts
from .claims_grammar import parse_rule
from .search_space import SearchSection
from .sections import (
    MAX_EVAL_EXAMPLES,
    AnalysisSection,
    EvalSection,
    MetricSpec,
    ModelSection,
    Resources,
    Schedule,
    Strict,
    TaskSection,
    TuneSection,
)
from .seeds import MAX_SEED, MAX_SEQUENTIAL_SEEDS, SEEDS_TAGS, SeedsField, SequentialSeeds
from .train_section import DISTILL_DEFAULTS, JSD_BETA_DEFAULT, DeepSpeedSection, TrainSection

__all__ = [
    "AXIS_ROOTS",
    "DISTILL_DEFAULTS",
    "JSD_BETA_DEFAULT",
    "MAX_EVAL_EXAMPLES",
    "MAX_SEED",
    "MAX_SEQUENTIAL_SEEDS",
    "SEEDS_TAGS",
    "AnalysisSection",
    "ClaimEntry",
    "DeepSpeedSection",
    "EvalSection",
    "MetricSpec",
    "ModelSection",
    "Resources",
    "Schedule",
    "SeedsField",
    "SequentialSeeds",
    "Strict",
    "Study",
    "TaskSection",
    "TrainSection",
    "TuneSection",
    "claim_texts",
]

AXIS_ROOTS = ("task", "model", "train", "eval")


def _check_rule(text: str) -> str:
    parse_rule(text)
    return text


class Study(Strict):
    name: str = Field(pattern=r"^[a-z0-9_-]+$", max_length=64, description="Unique per ledger.")
    description: str = ""
    task: TaskSection
    model: ModelSection
    train: TrainSection
    eval: EvalSection = Field(default_factory=EvalSection)
    grid: dict[str, list[Any]] = Field(
        default_factory=dict, description="Dotted path -> values; the Cartesian product of all axes."
    )
    zip: list[dict[str, list[Any]]] = Field(
        default_factory=list, description="Groups of dotted paths whose value lists vary together."
    )
    exclude: list[dict[str, Any]] = Field(
        default_factory=list, description="Partial configs (path -> value); matching cells are dropped."
    )
    include: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Extra cells beyond the grid: each a partial config (dotted path -> value) applied to the "
        "base config, e.g. one family's ablation beside a grid over model.family.",
    )
    seeds: SeedsField = Field(
        default_factory=lambda: [0],
        description="The seeds each cell runs: a list, e.g. [0, 1, 2]; or {start, max, step, spending}: the first "
        "`start` seeds, then more in waves to the cells the undecided claims select, until every claim is decided "
        "or `max` (docs/analysis/sequential.md).",
    )
    search: SearchSection | None = Field(
        None,
        description="An Optuna search over study-file paths (docs/guide/searches.md): n_trials configurations, each "
        "run once per seed; with grid axes, one search per grid cell.",
    )
    tune: TuneSection | None = Field(
        None,
        description="Settings chosen per cell before its seeds run, e.g. {grid: {train.lr: [1.0e-3, 2.0e-3, "
        "4.0e-3]}}: every cell trained once at each value (seed `tune.seed`), scored on the validation split, "
        "and run with its best value, so that arms of different depth each train at their own learning rate "
        "(docs/guide/study-files.md#tuning-per-cell).",
    )
    resources: Resources = Field(default_factory=Resources)
    metric: MetricSpec = Field(default_factory=MetricSpec)
    baselines: list[Literal["iso_param", "iso_flop"]] = Field(
        default_factory=list,
        description="Matched unlooped cells added for every looped cell: iso_param (same distinct layers run "
        "once, MLP widened to match parameters) and/or iso_flop (every block application a distinct layer).",
    )
    # Read by the analysis layer only (`studyrunner verify` / `analyze`); never part of a cell config or hash.
    claims: list[ClaimEntry] = Field(
        default_factory=list,
        description="Findings the study expects, checked by `studyrunner verify`: each a string, e.g. "
        "'eval_accuracy[loops=4] > eval_accuracy[loops=1]', or a mapping {claim: ..., min_effect: 0.05} "
        "(grammar and tests: docs/analysis/claims.md).",
    )
    multiplicity: Literal["none", "holm"] | None = Field(
        None,
        description="How the claims share the error rate. holm: a sequential study's looks run the graphical "
        "group-sequential Holm design (each claim starts with an equal share of alpha; a claim decided at a look "
        "passes its share on to the others, which are tested again at their larger level), so the chance that any "
        "claim is wrongly supported stays at alpha; none (default): each claim at alpha on its own "
        "(docs/analysis/sequential.md). With a list of seeds, `verify --holm` is Holm's step-down.",
    )
    failure: Annotated[str, AfterValidator(_check_rule)] | None = Field(
        None,
        description="When a finished trial counts as failed, e.g. 'eval_exact_match < 0.2 or halt_collapsed' "
        "(failed trials always count).",
    )
    analysis: AnalysisSection | None = Field(
        None, description="Options of `studyrunner analyze` and `report`: solve_threshold, logistic_top."
    )
    # How trials are run, not what they compute: never part of a cell config or hash either.
    divergence: Annotated[str, AfterValidator(_check_rule)] | None = Field(
        None,
        description="When a running trial has diverged, in the failure rule's grammar, e.g. 'train_loss > 20': "
        "checked on every record against the latest value of each metric; when it holds, the trial stops "
        "there as diverged, keeping its metrics (a non-finite train loss always counts).",
    )
    retries: int = Field(
        2,
        ge=0,
        le=100,
        description="How many times a trial is retried after an infrastructure failure (a lost worker, out "
        "of memory); it resumes from its latest checkpoint. Errors in code or config and diverged trials "
        "are not retried.",
    )

    # Where the study came from, for error messages and for storing the file as written.
    _source: str = PrivateAttr("<study>")
    _node: Any = PrivateAttr(None)
    _text: str | None = PrivateAttr(None)

    @property
    def source(self) -> str:
        return self._source

    @property
    def claim_texts(self) -> list[str]:
        """The claims' texts, in order (each entry's `claim`)."""
        return claim_texts(self.claims)

    @property
    def text(self) -> str:
        """The study file as written (or a YAML dump for a study built in code)."""
        if self._text is not None:
            return self._text
        import yaml

        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @model_validator(mode="after")
    def _tune_fits(self) -> Study:
        if self.tune is None:
            return self
        if self.search is not None:
            raise ValueError("tune: a search study chooses its settings itself; give `tune:` or `search:`, not both")
        from .tuning import SUFFIX  # here: tuning.py imports the compiled study, which imports this module

        if len(self.name) + len(SUFFIX) > 64:
            raise ValueError(f"name: a study with `tune:` has a name of at most {64 - len(SUFFIX)} characters "
                             f"(its tuning study is named NAME{SUFFIX})")  # fmt: skip
        return self

    @field_validator("baselines")
    @classmethod
    def _baselines_unique(cls, kinds: list[str]) -> list[str]:
        if len(set(kinds)) != len(kinds):
            raise ValueError("each baseline kind at most once")
        return kinds

    @property
    def sequential(self) -> SequentialSeeds | None:
        """The sequential design (`seeds: {start, max}`), None for a list of seeds."""
        return self.seeds if isinstance(self.seeds, SequentialSeeds) else None

    @property
    def seed_values(self) -> list[int]:
        """Every seed a cell may run: the list, or 0 .. max-1 of a sequential design."""
        return list(range(self.seeds.max)) if self.sequential else list(self.seeds)

    @property
    def first_seeds(self) -> list[int]:
        """The seeds every cell runs from the first submit: the list, or 0 .. start-1 of a sequential design."""
        return list(range(self.seeds.start)) if self.sequential else list(self.seeds)

    @field_validator("seeds", mode="before")
    @classmethod
    def _integral_seeds(cls, seeds: Any) -> Any:
        return _prepare(list[int], seeds) if isinstance(seeds, list) else seeds

    @field_validator("seeds")
    @classmethod
    def _seeds_unique(cls, seeds: list[int] | SequentialSeeds) -> list[int] | SequentialSeeds:
        if isinstance(seeds, SequentialSeeds):
            return seeds
        if not seeds:
            raise ValueError("give at least one seed")
        if len(set(seeds)) != len(seeds):
            raise ValueError("seeds must be unique")
        if any(s < 0 or s > MAX_SEED for s in seeds):
            raise ValueError(f"seeds must be between 0 and {MAX_SEED} (what the ledger stores and torch accepts)")
        return seeds
