"""Study files for LoopLM and MELT: a grid over model.family, `include:` cells, the new train knobs and
what `validate` rejects about them."""

import pytest

from studyrunner.errors import SpecError
from studyrunner.study import compile_study, loads

BASE = """\
name: fam
task: {name: mqar, params: {pairs: 4, queries: 2, keys: 16, values: 16}}
model: {family: looplm, params: {d_model: 32, n_heads: 2, block_layers: 2, loops: 2}}
train: {steps: 40, batch_size: 16, lr: 1.0e-3, warmup_steps: 4}
eval: {every: 20, examples: 64}
seeds: [0, 1]
"""


def compiled(extra: str = ""):
    return compile_study(loads(BASE + extra))


def error(extra: str) -> str:
    with pytest.raises(SpecError) as err:
        compiled(extra)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_grid_over_model_family_is_an_axis_like_any_other():
    c = compiled("grid: {model.family: [looplm, melt], model.params.loops: [1, 4]}\n")
    labels = [cell.label for cell in c.cells]
    assert labels == ["family=looplm loops=1", "family=looplm loops=4", "family=melt loops=1", "family=melt loops=4"]
    melt = c.cells[3].config["model"]
    assert melt["family"] == "melt" and melt["params"]["gate"] == "elementwise" and melt["params"]["loops"] == 4
    assert "gate" not in c.cells[1].config["model"]["params"]
    assert c.axes == ["model.family", "model.params.loops"]
    assert len(c.trials) == 8


def test_include_adds_cells_beyond_the_grid():
    c = compiled(
        "grid: {model.family: [looplm, melt]}\n"
        "include:\n"
        "  - {model.family: melt, model.params.gate: mean}\n"
        "  - {model.family: melt, model.params.gate: last, train.lr: 2.0e-3}\n"
    )
    assert [cell.label for cell in c.cells][2:] == ["family=melt gate=mean", "family=melt gate=last lr=0.002"]
    assert c.cells[3].config["train"]["lr"] == 0.002 and c.cells[3].overrides["model.params.gate"] == "last"
    assert c.axes == ["model.family", "model.params.gate", "train.lr"]
    plain = compiled("grid: {model.family: [looplm, melt]}\n")
    assert [x.cell_hash for x in c.cells[:2]] == [x.cell_hash for x in plain.cells]  # include adds, changes nothing


@pytest.mark.parametrize(
    "extra,words",
    [
        ("include:\n  - {model.params.gate: mean}\n", "include[0]['model.params.gate']: unknown key"),  # looplm
        ("include:\n  - {}\n", "empty entry"),
        ("include:\n  - {loops: 4}\n", "not a dotted path"),
        ("grid: {model.params.loops: [2, 4]}\ninclude:\n  - {model.params.loops: 4}\n", "same config"),
        ("grid: {model.family: [looplm, melt]}\ninclude:\n  - {model.family: melt, model.params.gate: odd}\n", "gate"),
    ],
)
def test_bad_include_entries_are_one_line_errors(extra, words):
    assert words in error(extra)


def test_a_family_grid_needs_params_every_family_has():
    message = error("grid: {model.family: [looplm, melt]}\n".replace("looplm, melt", "looplm, melt, ut_act"))
    assert "block_layers" in message and "ut_act" in message or "grid" in message


@pytest.mark.parametrize(
    "family,params,train,words",
    [
        ("melt", "", "exit_entropy_beta: 0.05", "exit_kl_uniform"),
        ("looplm", "", "distill_lambda: 1.0", "'distill' term"),
        ("melt", "", "align_beta: 0.1", "model.params.teacher"),
        ("melt", ", interpolate_steps: 40", "", "interpolate_steps"),
        ("melt", ", gate: mean, gate_bias_init: 0.0", "", "gate_bias_init has no effect"),
        ("melt", ", ema_decay: 0.5", "", "ema_decay has no effect"),
        ("melt", ", teacher: not-a-key", "", "teacher"),
        ("melt", ", chunk_size: 0", "", "chunk_size"),
        ("looplm", ", exit_step: 3", "", "exit_step"),
        ("looplm", ", exit_step: 1, exit_threshold: 0.5", "", "not both"),
    ],
)
def test_knobs_that_do_not_fit_the_config_are_rejected(family, params, train, words):
    text = BASE.replace("family: looplm", f"family: {family}").replace("loops: 2}", f"loops: 2{params}}}")
    if train:
        text = text.replace("warmup_steps: 4}", f"warmup_steps: 4, {train}}}")
    with pytest.raises(SpecError) as err:
        compile_study(loads(text))
    assert words in str(err.value)


def test_new_knobs_unset_stay_out_of_the_resolved_config():
    train = compiled().cells[0].config["train"]
    assert not {"exit_entropy_beta", "distill_lambda", "align_beta", "align_start_step"} & set(train)
    beta = compile_study(loads(BASE.replace("warmup_steps: 4}", "warmup_steps: 4, exit_entropy_beta: 0.05}")))
    assert beta.cells[0].config["train"]["exit_entropy_beta"] == 0.05
    assert beta.cells[0].cell_hash != compiled().cells[0].cell_hash


def test_melt_on_a_bidirectional_task_is_rejected_at_validate():
    text = BASE.replace("family: looplm", "family: melt").replace(
        "{name: mqar, params: {pairs: 4, queries: 2, keys: 16, values: 16}}", "{name: sudoku, params: {}}"
    )
    with pytest.raises(SpecError) as err:
        compile_study(loads(text))
    assert "model.family" in str(err.value) and "bidirectional" in str(err.value)


def test_decoding_metrics_are_known_to_validate_for_families_that_decode():
    ok = compile_study(loads(BASE + "metric: {name: kv_cache_bytes_per_token, mode: min}\n"))
    assert ok.study.metric.name == "kv_cache_bytes_per_token"
    compile_study(loads(BASE + "metric: {name: eval_decode_accuracy}\n"))
    ut_act = BASE.replace("family: looplm", "family: ut_act").replace("block_layers: 2, ", "")
    with pytest.raises(SpecError, match="eval_decode_accuracy"):  # ut_act has no KV cache decoding
        compile_study(loads(ut_act + "metric: {name: eval_decode_accuracy}\n"))


def test_a_zip_row_at_fault_names_the_field():
    message = error("zip:\n  - model.family: [looplm, melt]\n    train.exit_entropy_beta: [0.05, 0.05]\n")
    assert "zip[0]['model.family'][1]: train.exit_entropy_beta: weights the 'exit_kl_uniform' term" in message
    ok = compiled("zip:\n  - model.family: [looplm, melt]\n    train.exit_entropy_beta: [0.05, null]\n")
    assert [c.config["train"].get("exit_entropy_beta") for c in ok.cells] == [0.05, None]


def test_a_melt_chunk_longer_than_the_sequence_is_the_fully_parallel_cell():
    """`chunk_size` past the sequence length would make a second cell that trains exactly as the fully parallel
    one does. It is clipped to the task's sequence length (mqar here: 11 tokens) when compiled."""
    import torch

    from studyrunner.models import build_model
    from studyrunner.tasks import build_task

    melt = BASE.replace("family: looplm", "family: melt")

    def cell(chunk: int):
        (only,) = compile_study(loads(melt.replace("loops: 2}", f"loops: 2, chunk_size: {chunk}}}"))).cells
        return only

    assert cell(64).config["model"]["params"]["chunk_size"] == 11
    assert cell(64).cell_hash == cell(12).cell_hash == cell(11).cell_hash != cell(10).cell_hash
    assert cell(4).config["model"]["params"]["chunk_size"] == 4
    with pytest.raises(SpecError, match=r"cells 'chunk_size=11' and 'chunk_size=64' resolve to the same config"):
        compile_study(loads(melt + "grid: {model.params.chunk_size: [1, 11, 64]}\n"))
    # Why they are one cell: the same weights give the same logits.
    task = build_task("mqar", {"pairs": 4, "queries": 2, "keys": 16, "values": 16}, 0)
    batch = task.eval_sets(4)[""]
    logits = []
    for chunk in (11, 64):
        torch.manual_seed(0)
        model = build_model("melt", {"d_model": 16, "n_heads": 2, "loops": 2, "chunk_size": chunk}, task.facts)
        logits.append(model(batch.inputs).logits)
    assert torch.equal(*logits)
