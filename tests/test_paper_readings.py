"""The papers' readings, wherever the code could read a paper more than one way: each an option whose default is
the paper's. LoopFormer's official shortcut sampler, LoopLM's (and MELT's) normed loop input, MELT's phase
objectives without the task loss, per-group learning rates, and the named distillation divergences."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from studyrunner.errors import StudyrunnerError
from studyrunner.models import build_model
from studyrunner.models.distillation import divergence
from studyrunner.models.loopformer import LoopFormerParams
from studyrunner.models.trajectories import grid_label, sample_shortcut, sample_steps
from studyrunner.study import compile_study, loads
from studyrunner.train.engine import train_step
from studyrunner.train.optim import lr_at
from studyrunner.train.schedules import aux_weights
from studyrunner.train.trainer import build_trial, run_trial
from studyrunner.train.trial_progress import Progress

FACTS = SimpleNamespace(vocab_size=13, seq_len=10, causal=True)

# ------------------------------------------------------------------------ LoopFormer's shortcut sampler


def draws(sampler: str, n: int = 40_000) -> dict[str, float]:
    torch.manual_seed(0)
    counts: dict[str, int] = {}
    for _ in range(n):
        label = grid_label(sample_steps(sampler, 8, 4), 8)
        counts[label] = counts.get(label, 0) + 1
    return {label: c / n for label, c in counts.items()}


def test_the_official_sampler_is_the_default_and_front_loads_as_the_review_measured():
    """L = 8, S = 4 (fidelity_review.md): official P(5,1,1,1) 0.199, P(first >= 4/8) 0.39; uniform over the
    35 compositions 0.029 and 0.11."""
    assert LoopFormerParams().shortcut_sampler == "grid_sequential"
    official, uniform = draws("grid_sequential"), draws("grid_composition")
    first_long = lambda p: sum(v for k, v in p.items() if int(k.split("_")[0]) >= 4)  # noqa: E731
    assert official["5_1_1_1"] == pytest.approx(0.2, abs=0.01)
    assert first_long(official) == pytest.approx(0.4, abs=0.01)
    assert uniform["5_1_1_1"] == pytest.approx(1 / 35, abs=0.005)
    assert first_long(uniform) == pytest.approx(4 / 35, abs=0.01)
    assert len(official) == len(uniform) == 35  # both reach every composition
    assert max(uniform.values()) < 1.3 * min(uniform.values())


def test_a_training_forward_draws_its_shortcut_from_the_default_sampler():
    model = build_model("loopformer", {"d_model": 16, "n_heads": 2, "loops": 8}, FACTS)
    runs = []
    modulations = model._modulations
    model._modulations = lambda steps, device: runs.append(list(steps)) or modulations(steps, device)
    x = torch.randint(0, 13, (2, 10))
    for seed in range(50):
        torch.manual_seed(seed)
        model(x)
        torch.manual_seed(seed)
        assert runs[-1] == sample_shortcut("grid_sequential", 8, 7)  # the full run, then the drawn one
    assert any(len(r) > 2 and r[0] > r[-1] for r in runs[1::2])


# --------------------------------------------------------------------------- LoopLM's normed recurrence


def by_hand(model, x, loops, normed):
    """Ouro's loop written out: N layers, the final norm, the head; the next loop reads the normed state."""
    h, logits = model.embed(x), []
    for _ in range(loops):
        for block in model.blocks:
            h = block(h)
        n = model.head.norm(h)
        logits.append(model.head.out(n))
        h = n if normed else h
    return logits


@pytest.mark.parametrize("loop_input", ["normed", "residual"])
def test_looplm_loops_read_what_loop_input_says(loop_input):
    torch.manual_seed(0)
    model = build_model(
        "looplm", {"d_model": 16, "n_heads": 2, "block_layers": 2, "loops": 3, "loop_input": loop_input}, FACTS
    )
    x = torch.randint(0, 13, (3, 10))
    with torch.no_grad():
        logits, _ = model.run(x, 3)
        for mine, theirs in zip(logits, by_hand(model, x, 3, loop_input == "normed"), strict=True):
            torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=0)
        other = by_hand(model, x, 3, loop_input != "normed")
    torch.testing.assert_close(logits[0], other[0])  # the first loop reads the embedding either way
    assert (logits[-1] - other[-1]).abs().max() > 1e-3  # later loops do not


def test_normed_is_the_default_of_looplm_and_melt():
    looplm = build_model("looplm", {"d_model": 16, "n_heads": 2}, FACTS)
    melt = build_model("melt", {"d_model": 16, "n_heads": 2}, FACTS)
    assert looplm.p.loop_input == melt.p.loop_input == "normed"


@pytest.mark.parametrize("loop_input", ["normed", "residual"])
def test_melt_inherits_the_loop_input(loop_input):
    """MELT with the `last` gate (K, V from the loop's own input) and one chunk for the whole sequence is
    a LoopLM; it reads between loops what its LoopLM reads."""
    torch.manual_seed(0)
    common = {"d_model": 16, "n_heads": 2, "block_layers": 2, "loops": 3, "loop_input": loop_input}
    looplm = build_model("looplm", common, FACTS).eval()
    melt = build_model("melt", {**common, "gate": "last", "chunk_size": 10}, FACTS).eval()
    melt.load_state_dict({k: v for k, v in looplm.state_dict().items() if not k.startswith("exit_gate")}, strict=False)
    x = torch.randint(0, 13, (3, 10))
    with torch.no_grad():
        torch.testing.assert_close(melt(x).logits, looplm(x).logits, atol=1e-5, rtol=0)
    teacher = build_model("looplm", {**common, "loop_input": "residual" if loop_input == "normed" else "normed"}, FACTS)
    with pytest.raises(ValueError, match="loop_input"):
        build_model("melt", common, FACTS).convert_from(teacher)


# ---------------------------------------------------------------------- MELT's objectives (section 3.3)

TASK = "task: {name: mqar, params: {pairs: 4, queries: 2, keys: 16, values: 16}}\n"
TEACHER = (
    "name: teacher\n"
    + TASK
    + "model: {family: looplm, params: {d_model: 16, n_heads: 2, block_layers: 1, loops: 2}}\n"
    + "train: {steps: 4, batch_size: 8, warmup_steps: 1, log_every: 1}\neval: {every: 4, examples: 16}\nseeds: [0]\n"
)


def student(train: str, **params) -> dict:
    extra = "".join(f", {k}: {v}" for k, v in params.items())
    text = (
        "name: student\n"
        + TASK
        + "model: {family: melt, params: {d_model: 16, n_heads: 2, block_layers: 1, loops: 2, chunk_size: 3, "
        + f"teacher: teacher-0123456789ab-s0{extra}}}}}\n"
        + f"train: {{steps: 6, batch_size: 8, warmup_steps: 1, log_every: 1, {train}}}\n"
        + "eval: {every: 6, examples: 16}\nseeds: [0]\n"
    )
    return compile_study(loads(text)).cells[0].config


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    config = compile_study(loads(TEACHER)).cells[0].config
    folder = tmp_path_factory.mktemp("teacher")
    run_trial(config, 0, checkpoints=str(folder))
    return {"config": config, "seed": 0, "checkpoint": str(folder)}


def objective_terms(trial, step):
    """The raw terms of the student's loss on the batch of `step`, computed apart from the trainer."""
    trial.model.set_train_step(step)
    batch = trial.batch(step)
    with torch.no_grad():
        out = trial.model(batch.inputs)
        ce = trial.task.loss(out.logits, batch)
    return ce.item(), out.aux["distill"].item(), out.aux["attn_align"].item()


@pytest.mark.parametrize("task_loss", [None, "always"])
def test_phase_objectives_have_exactly_the_papers_terms(teacher, task_loss):
    """Phase 1 (steps before align_start_step): lambda L_KD; phase 2: lambda L_KD + beta align; the task
    cross-entropy only with train.task_loss: always."""
    knobs = "distill_lambda: 0.7, align_beta: 0.1, align_start_step: 2" + (
        f", task_loss: {task_loss}" if task_loss else ""
    )
    config = student(knobs, interpolate_steps=2)
    assert config["train"]["task_loss"] == (task_loss or "unless_distilled")  # resolved, so in the cell hash
    trial = build_trial(config, 0, teacher=teacher)
    with torch.no_grad():  # a converted student starts equal to its teacher (L_KD = 0): move it off first
        torch.manual_seed(0)
        for p in trial.model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    progress = Progress()
    for step in range(4):
        ce, kd, align = objective_terms(trial, step)
        weights = aux_weights(step, trial.train, {"distill": None, "attn_align": None})
        assert weights == {"distill": 0.7, "attn_align": 0.1 if step >= 2 else 0.0}
        expected = 0.7 * kd + weights["attn_align"] * align + (ce if task_loss == "always" else 0.0)
        trial.model.train()
        train_step(trial, progress)
        assert progress.window.loss == pytest.approx(expected, rel=1e-5)
        progress.window.reset()
        assert ce > 0.1 and kd > 1e-4 and align > 1e-4  # every term is there to be left out, well above rounding


def test_without_distillation_the_task_loss_trains_the_student(teacher):
    """Table 4's '- GKD' row: no distillation reduces training to standard SFT (the task loss)."""
    trial = build_trial(student("align_beta: 0.1"), 0, teacher=teacher)
    ce, _, align = objective_terms(trial, 0)
    progress = Progress()
    trial.model.train()
    train_step(trial, progress)
    assert progress.window.loss == pytest.approx(ce + 0.1 * align, rel=1e-5)


def test_distillation_knobs_resolve_to_the_papers_reading_and_are_refused_without_distillation():
    train = student("distill_lambda: 1.0")["train"]
    assert {k: train[k] for k in ("distill_divergence", "distill_jsd_beta", "distill_temperature")} == {
        "distill_divergence": "jsd",
        "distill_jsd_beta": 0.5,
        "distill_temperature": 1.0,
    }
    assert "distill_divergence" not in student("align_beta: 0.1")["train"]  # no distillation, no knob
    with pytest.raises(StudyrunnerError, match="task_loss is set but nothing is distilled"):
        student("task_loss: always")
    with pytest.raises(StudyrunnerError, match="distill_jsd_beta has no effect"):
        student("distill_lambda: 1.0, distill_divergence: forward_kl, distill_jsd_beta: 0.2")


# ------------------------------------------------------------------------------------ the divergences


def test_divergences_are_the_named_ones():
    torch.manual_seed(0)
    s, t = torch.randn(5, 7, 11), torch.randn(5, 7, 11)
    p, q = F.softmax(t, -1), F.softmax(s, -1)
    kl = lambda a, b: (a * (a / b).log()).sum(-1).mean()  # noqa: E731
    assert divergence(s, t, "forward_kl").item() == pytest.approx(kl(p, q).item(), rel=1e-5)
    assert divergence(s, t, "reverse_kl").item() == pytest.approx(kl(q, p).item(), rel=1e-5)
    for beta in (0.1, 0.5, 0.9):
        m = beta * p + (1 - beta) * q
        jsd = beta * kl(p, m) + (1 - beta) * kl(q, m)
        assert divergence(s, t, "jsd", beta=beta).item() == pytest.approx(jsd.item(), rel=1e-5)
    # GKD's limits: JSD_beta / beta -> forward KL as beta -> 0, and / (1 - beta) -> reverse KL as beta -> 1
    assert divergence(s, t, "jsd", beta=1e-4).item() / 1e-4 == pytest.approx(kl(p, q).item(), rel=1e-2)
    assert divergence(s, t, "jsd", beta=1 - 1e-4).item() / 1e-4 == pytest.approx(kl(q, p).item(), rel=1e-2)
    hot = F.softmax(t / 2, -1), F.softmax(s / 2, -1)
    assert divergence(s, t, "forward_kl", temperature=2.0).item() == pytest.approx(kl(*hot).item(), rel=1e-5)
    assert divergence(t, t, "jsd").item() == pytest.approx(0.0, abs=1e-7)


def test_the_student_distils_with_the_divergence_the_study_names(teacher):
    values = {}
    for name in ("forward_kl", "reverse_kl", "jsd"):
        trial = build_trial(student(f"distill_lambda: 1.0, distill_divergence: {name}"), 0, teacher=teacher)
        assert trial.model.distill == {"kind": name, "beta": 0.5, "temperature": 1.0}
        trial.model.train()
        with torch.no_grad():
            values[name] = trial.model(trial.batch(0).inputs).aux["distill"].item()
    assert len(set(values.values())) == 3 and min(values.values()) > 0
    assert values["jsd"] < min(values["forward_kl"], values["reverse_kl"])  # JSD_0.5 <= ln 2, bounded


# --------------------------------------------------------------------------------------- lr groups

STUDY = (
    "name: groups\n"
    + TASK
    + "model: {family: melt, params: {d_model: 16, n_heads: 2, loops: 2, chunk_size: 3}}\n"
    + "train: {steps: 8, batch_size: 8, lr: 1.0e-3, warmup_steps: 3, min_lr_ratio: 0.1, log_every: 1, LR}\n"
    + "eval: {every: 8, examples: 16}\nseeds: [0]\n"
)


def test_lr_groups_reach_the_optimizer_through_warmup_and_cosine():
    config = compile_study(loads(STUDY.replace("LR", "lr_groups: {gates: 5.0e-4, rest: 8.0e-6}"))).cells[0].config
    trial = build_trial(config, 0)
    gates = {id(p) for p in trial.model.gates.parameters()}
    by_group = {g["lr_group"]: g for g in trial.optimizer.param_groups}
    assert {id(p) for g in trial.optimizer.param_groups if g["lr_group"] == "gates" for p in g["params"]} == gates
    assert sum(len(g["params"]) for g in trial.optimizer.param_groups) == len(list(trial.model.parameters()))
    assert by_group.keys() == {"gates", "rest"}
    progress = Progress()
    for step in range(8):
        train_step(trial, progress)
        factor = lr_at(step, lr=1.0, steps=8, warmup_steps=3, min_lr_ratio=0.1)
        for group in trial.optimizer.param_groups:
            peak = 5e-4 if group["lr_group"] == "gates" else 8e-6
            assert group["lr"] == pytest.approx(peak * factor, rel=1e-9)


def test_a_group_the_config_lacks_goes_unused():
    """A grid over MELT's gates: the fixed variants have no gate parameters; their cells still validate."""
    config = compile_study(
        loads(STUDY.replace("LR", "lr_groups: {gates: 5.0e-4}").replace("loops: 2", "loops: 2, gate: mean"))
    )
    trial = build_trial(config.cells[0].config, 0)
    assert {g["lr_group"] for g in trial.optimizer.param_groups} == {"rest"}


def test_without_lr_groups_one_rate_and_the_two_decay_groups_as_before():
    trial = build_trial(compile_study(loads(STUDY.replace(", LR", ""))).cells[0].config, 0)
    groups = trial.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0] and all(g["lr_scale"] == 1.0 for g in groups)
    assert "lr_groups" not in compile_study(loads(STUDY.replace(", LR", ""))).cells[0].config["train"]


@pytest.mark.parametrize(
    ("family", "groups", "message"),
    [
        (
            "melt",
            "{gate: 1.0e-3}",
            "names group 'gate', which model family 'melt' does not have; its groups: gates, rest",
        ),
        ("looplm", "{gates: 1.0e-3}", "its groups: exit_gate, rest"),
        ("melt", "{rest: 0}", "a learning rate is a number in"),
    ],
)
def test_unknown_or_bad_lr_groups_are_refused_naming_the_groups(family, groups, message):
    text = STUDY.replace("LR", f"lr_groups: {groups}").replace("family: melt", f"family: {family}")
    text = text.replace(", chunk_size: 3", "" if family != "melt" else ", chunk_size: 3")
    with pytest.raises(StudyrunnerError, match=message):
        compile_study(loads(text))


# ------------------------------------------------------------------------ the teacher's own numbers


def test_a_conversion_scores_its_teacher_on_its_own_eval_sets(teacher):
    """teacher_eval_* (and the decoding and KV metrics of a decoded task): a claim can set each student
    beside its teacher; validate knows the names."""
    from studyrunner.train.evaluation import decoding_eval, evaluate

    trial = build_trial(student("distill_lambda: 1.0"), 0, teacher=teacher)
    frozen = trial.model._teacher[0]
    expected = evaluate(frozen, trial.task, trial.splits, representations=False)
    assert trial.static["teacher_eval_loss"] == expected["eval_loss"]
    decoded = decoding_eval(frozen, trial.task, trial.splits)
    assert trial.static["teacher_eval_decode_loss"] == decoded["eval_decode_loss"]
    assert "teacher_decode_tokens_per_sec" not in trial.static  # wall-clock: not reproducible
    assert trial.static["teacher_kv_cache_bytes_per_token"] == 2 * trial.model.kv_bytes_per_token()  # T=2 rows vs 1
    text = TEACHER.replace("name: teacher", "name: s").replace("family: looplm", "family: melt")
    text = text.replace("loops: 2}", "loops: 2, chunk_size: 3, teacher: teacher-0123456789ab-s0}")
    text = text.replace("log_every: 1}", "log_every: 1, distill_lambda: 1.0}")
    claim = 'claims: ["eval_decode_loss > teacher_eval_decode_loss", "teacher_kv_cache_bytes_per_token > 1"]\n'
    compile_study(loads(text + claim))
    with pytest.raises(StudyrunnerError, match="teacher_eval_bogus"):
        compile_study(loads(text + 'claims: ["eval_loss > teacher_eval_bogus"]\n'))


def test_cells_that_turn_the_distillation_off_or_change_it_compose_with_a_distilling_base():
    """The base's resolved defaults (task_loss, divergence, beta) must not make a variant invalid."""
    text = (
        "name: student\n"
        + TASK
        + "model: {family: melt, params: {d_model: 16, n_heads: 2, loops: 2, teacher: teacher-0123456789ab-s0}}\n"
        + "train: {steps: 6, distill_lambda: 1.0, align_beta: 0.1}\nseeds: [0]\n"
        + "grid: {train.distill_divergence: [jsd, forward_kl]}\n"
        + "include: [{train.distill_lambda: null, train.distill_divergence: null}]\n"
    )
    cells = {c.label: c.config["train"] for c in compile_study(loads(text)).cells}
    assert cells["distill_divergence=jsd"]["distill_jsd_beta"] == 0.5
    assert "distill_jsd_beta" not in cells["distill_divergence=forward_kl"]
    off = cells["distill_lambda=None distill_divergence=None"]
    assert not any(k.startswith(("distill", "task_loss")) for k in off)
