"""The trial config the trainer reads (`train.config.TrialConfig`): the compiled dict read into frozen section
models, value for value; the dict stays the recorded form (hashes, checkpoints); the models keep up with the
study schema's sections field by field; and the optional hooks of families, found by protocol."""

from pathlib import Path

import pytest
import torch
from conftest import TINY_STUDY
from pydantic import ValidationError

from studyrunner.models import build_model
from studyrunner.study import compile_study, config_hash, load, loads
from studyrunner.study.schema import DeepSpeedSection, EvalSection, ModelSection, TaskSection, TrainSection
from studyrunner.tasks import build_task
from studyrunner.train.config import DeepSpeedConfig, EvalConfig, ModelConfig, TaskConfig, TrainConfig, TrialConfig
from studyrunner.train.hooks import (
    Configurable,
    Decoder,
    DrawsCompute,
    KeepsKVCache,
    RealisesLoops,
    StepDependent,
    WatchesGradients,
)
from studyrunner.train.trainer import build_trial

STUDIES = Path(__file__).resolve().parents[1] / "studies"
PAIRS = [
    (TaskConfig, TaskSection),
    (ModelConfig, ModelSection),
    (TrainConfig, TrainSection),
    (DeepSpeedConfig, DeepSpeedSection),
    (EvalConfig, EvalSection),
]


def tiny_config():
    return compile_study(loads(TINY_STUDY)).cells[1].config


def test_every_shipped_cell_reads_back_to_its_dict_and_keeps_its_hash():
    """Validating a compiled config changes no value: dumped again it is the same dict, so the same cell hash
    and trial keys (what ledgers store); `resolved` is the dict itself, what checkpoints are matched against."""
    cells = 0
    for path in sorted(STUDIES.rglob("*.yaml")):
        compiled = compile_study(load(path))
        for cell in compiled.cells + compiled.bases:
            config = TrialConfig.of(cell.config)
            assert config.dump() == cell.config, (path.name, cell.label)
            assert config_hash(config.dump()) == cell.cell_hash
            assert config.resolved is cell.config
            cells += 1
    assert cells > 100


@pytest.mark.parametrize("ours,schema", PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_the_sections_have_the_schemas_fields_and_defaults(ours, schema):
    """A knob the study schema gains must be added to the trainer's section too (until then, a config that
    sets it is refused, never read wrong)."""
    assert list(ours.model_fields) == list(schema.model_fields)
    for name, field in schema.model_fields.items():
        mine = ours.model_fields[name]
        assert mine.is_required() == field.is_required(), name
        if not field.is_required():
            assert mine.get_default(call_default_factory=True) == field.get_default(call_default_factory=True), name


def test_sections_are_frozen_and_unknown_knobs_refused():
    config = TrialConfig.of(tiny_config())
    assert TrialConfig.of(config) is config
    assert isinstance(config.train, TrainConfig) and config.train.betas == (0.9, 0.98)
    with pytest.raises(ValidationError, match="frozen"):
        config.train.lr = 1.0
    with pytest.raises(ValidationError, match="telepathy"):
        TrainConfig.model_validate({**tiny_config()["train"], "telepathy": 1.0})
    with pytest.raises(ValidationError, match="steps"):
        TrainConfig.model_validate({**tiny_config()["train"], "steps": "12"})  # strict, as the schema


def test_a_config_made_in_code_dumps_as_compiled():
    compiled = tiny_config()
    made = TrialConfig(
        task=TaskConfig(**compiled["task"]),
        model=ModelConfig(**compiled["model"]),
        train=TrainConfig(**compiled["train"]),
        eval=EvalConfig(**compiled["eval"]),
    )
    assert made.resolved == compiled and made == TrialConfig.of(compiled)


def test_the_trial_reads_its_config_once_and_keeps_the_dict():
    compiled = tiny_config()
    trial = build_trial(compiled, seed=0)
    assert trial.config.resolved is compiled
    assert trial.train is trial.config.train and trial.ev is trial.config.eval
    assert (trial.steps, trial.train.batch_size, trial.ev.every) == (12, 16, 6)
    assert compiled == tiny_config()  # nothing written into it


FACTS = build_task("mqar", {"pairs": 4, "queries": 2, "keys": 16, "values": 16}, seed=0).facts
HOOKS = (Configurable, WatchesGradients, StepDependent, Decoder, KeepsKVCache, DrawsCompute, RealisesLoops)


@pytest.mark.parametrize(
    "family,params,hooks",
    [
        ("looped", {}, {Decoder, KeepsKVCache}),
        ("loopformer", {}, {Configurable, DrawsCompute}),
        ("ut_act", {"memory_slots": 2}, {WatchesGradients, RealisesLoops}),
        ("looplm", {}, {Decoder, KeepsKVCache}),
        ("melt", {"chunk_size": 2}, {Configurable, StepDependent, Decoder, KeepsKVCache}),
    ],
)
def test_families_have_the_hooks_the_registry_lists(family, params, hooks):
    with torch.device("meta"):
        model = build_model(family, {"d_model": 16, "n_heads": 2, "loops": 2, **params}, FACTS)
    assert {hook for hook in HOOKS if isinstance(model, hook)} == hooks
