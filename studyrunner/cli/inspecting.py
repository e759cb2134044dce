"""`validate`, `plan`, `status` and `results`: the verbs that check a study file or read the ledger."""

from __future__ import annotations

import dataclasses
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import StudyrunnerError
from .common import (
    DbOpt,
    StaleOpt,
    StudyFile,
    WorkspaceOpt,
    app,
    err,
    open_workspace,
    out,
    read_ledger,
    user_errors,
    warn,
)


@app.command()
@user_errors
def validate(file: StudyFile):
    """Check a study file (schema, family and task params, grid) without running it."""
    from ..study import load_and_compile

    compiled = load_and_compile(file)
    warn(compiled.warnings)
    if compiled.study.search:
        counts = _search_line(compiled)
    elif compiled.study.sequential:
        counts = _sequential_line(compiled)
    else:
        counts = f"{len(compiled.cells)} cells, {len(compiled.trials)} trials"
    out.print(f"{file}: ok ({counts})", markup=False, highlight=False)
    _print_reach(compiled)


def _print_packs(compiled) -> None:
    """How the trials train where `train.pack` packs them: packs (one Ray trial and one process each, with the
    study's `resources:`) and the trials trained alone."""
    from ..train.packing import pack_groups

    packs, alone = pack_groups(compiled.trials)
    if not packs:
        return
    sizes = sorted({len(p) for p in packs})
    shown = "-".join(str(n) for n in (sizes[0], sizes[-1])) if len(sizes) > 1 else str(sizes[0])
    r = compiled.study.resources
    out.print(
        f"packed (train.pack): {sum(map(len, packs))} trials in {len(packs)} pack{'s' * (len(packs) > 1)} of "
        f"{shown} members, each one Ray "
        f"trial with {r.cpu:g} CPU" + (f" and {r.gpu:g} GPU" if r.gpu else "")
        + (f"; {len(alone)} trials alone" if alone else "")
        + ("" if not compiled.study.sequential else " (the first look; later waves pack the seeds they add)"),
        markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip


def _print_reach(compiled) -> None:
    """Per claim, the smallest one-sided p its test can reach with the study's seeds; a warning for each
    claim that cannot reach the level it is decided at (it can only come out inconclusive)."""
    from ..study.claims_check import ALPHA, claim_reach

    reach = claim_reach(compiled)
    if not reach:
        return
    seeds = "at its most seeds (max)" if compiled.study.sequential else "with these seeds"
    out.print(f"claims (decided at one-sided p < {ALPHA:g}; the smallest p each test can reach {seeds}):",
              markup=False, highlight=False)  # fmt: skip
    for r in reach:
        out.print(f"  {r.line()}", markup=False, highlight=False, soft_wrap=True)
    warn([f"claims[{r.index}] cannot be decided with {r.seeds} seeds" + (f"; it needs {r.needs}" if r.needs else "")
          for r in reach if not r.reaches])  # fmt: skip
    warn([f"claims[{r.index}]: seeds that tie at the metric's bound (all solved, exact match 1.0) go to the exact "
          f"sign-flip test, which decides nothing below {r.tie_needs} seeds; with {r.seeds} a tie stays inconclusive: "
          f"give it {r.tie_needs} seeds or more" for r in reach if r.tie_needs])  # fmt: skip


def _print_threats_before_training(compiled, facts) -> None:
    """Per claim, the threats to its validity known before anything runs (analysis/claims/validity.py): sides that
    differ in more than the claim names, properties declared `matched:` that are not."""
    from ..analysis.claims.validity import before_training

    if compiled.study.search is not None or not compiled.study.claims:
        return
    threats = before_training(compiled, facts)
    if not any(threats):
        out.print("threats to validity known before training: none", markup=False, highlight=False)
        return
    out.print("threats to validity known before training (docs/analysis/validity.md):", markup=False, highlight=False)
    for i, found in enumerate(threats):
        for t in found:
            out.print(f"  claims[{i}] {t.threat}: {t.detail}", markup=False, highlight=False, soft_wrap=True)


def _sequential_line(compiled) -> str:
    seeds, cells = compiled.study.sequential, len(compiled.cells)
    return (
        f"{cells} cells, sequential seeds {seeds.start} to {seeds.max}: {cells * seeds.start} trials first, "
        f"at most {cells * seeds.max}"
    )


def _search_line(compiled) -> str:
    search, seeds, grid = compiled.study.search, len(compiled.study.seed_values), len(compiled.bases)
    per = f" in each of {grid} grid cells" if grid > 1 else ""
    return (
        f"search: {search.algorithm} {search.sampler}, {search.n_trials} configurations x {seeds} seeds{per} = "
        f"up to {grid * search.n_trials * seeds} trials"
    )


@app.command()
@user_errors
def plan(file: StudyFile):
    """Show the cells and trials a study compiles to, with parameter counts and FLOPs per token, without training."""
    import torch

    from ..models import build_model, count_params
    from ..study import load_and_compile
    from ..tasks import build_task
    from ..train.flops import analytic_flops_per_token, format_flops

    compiled = load_and_compile(file)
    warn(compiled.warnings)
    study = compiled.study
    seeds = len(study.seed_values)
    title = f"{study.name}: {len(compiled.cells)} cells x {seeds} seeds = {len(compiled.trials)} trials"
    if study.search:  # the grid cells its searches run in, at the base values of the searched paths
        compiled = dataclasses.replace(compiled, cells=compiled.bases)
        title = f"{study.name}: {_search_line(compiled)}; grid cells (searched paths at their base values)"
    elif study.sequential:
        title = f"{study.name}: {_sequential_line(compiled)}"
    table = Table(title=Text(title))
    columns = ["#", "cell", "cell_hash", "family", "params", "effective_depth", "FLOPs/token", "steps"]
    has_baselines = any(c.baseline_of for c in compiled.cells)
    numeric = ("#", "params", "effective_depth", "FLOPs/token", "steps")
    for col in columns + (["baseline of"] if has_baselines else []):
        table.add_column(col, justify="right" if col in numeric else "left")
    number = {c.cell_hash: i for i, c in enumerate(compiled.cells, 1)}
    halting = False
    facts: dict[str, dict[str, float]] = {}  # per cell: params, FLOPs per token (the claims' `matched:`)
    for i, cell in enumerate(compiled.cells, 1):
        task = build_task(cell.config["task"]["name"], cell.config["task"]["params"], seed=0)
        with torch.random.fork_rng(devices=[]), torch.device("meta"):  # count parameters without allocating them
            model = build_model(cell.config["model"]["family"], cell.config["model"]["params"], task.facts)
        if hasattr(model, "configure"):  # a family's own train/eval knobs (train.trajectory sets the loops)
            model.configure(cell.config["train"], cell.config["eval"])
        facts[cell.cell_hash] = {"params": float(count_params(model))}
        try:
            per_token = analytic_flops_per_token(model, cell.config["train"]["batch_size"], task.facts.seq_len)
            flops = format_flops(per_token)
            facts[cell.cell_hash]["flops_per_token"] = float(per_token)
        except Exception as exc:  # noqa: BLE001 - a figure the meta device cannot count must not hide the plan
            flops = "?"
            warn([f"cell '{cell.label}': FLOPs not counted on the meta device ({type(exc).__name__}: {exc})"])
        halts = hasattr(model, "realised_loops") and "ponder_steps_fraction" in model.diagnostic_names
        if halts and model.loops > 1:
            flops, halting = f"{flops}*", True
        table.add_row(
            str(i),
            Text(cell.label),
            cell.cell_hash,
            cell.config["model"]["family"],
            f"{count_params(model):,}",
            str(model.effective_depth),
            flops,
            str(cell.config["train"]["steps"]),
            *([", ".join(f"{kind} of #{number[h]}" for kind, h in cell.baseline_of)] if has_baselines else []),
        )
    out.print(table)
    out.print(
        "FLOPs/token: model FLOPs of a training forward + backward (matmuls and attention) per input token of a "
        "batch of train.batch_size x the task's sequence length, counted on the meta device"
        + ("; * a halting cell, at its most loop steps: its trials record the depth they realise" if halting else ""),
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    _print_packs(compiled)
    _print_reach(compiled)
    _print_threats_before_training(compiled, facts)
    _print_tuning_plan(study)
    if study.search:
        space = Table(title=Text(f"search space ({study.search.sampler}, seed {study.search.seed})"))
        for col in ("path", "range"):
            space.add_column(col)
        for path, domain in study.search.space.items():
            space.add_row(
                Text(path),
                Text(f"{domain.kind} {list(domain.choices) if domain.kind == 'choice' else [domain.low, domain.high]}"),
            )
        out.print(space)
    if study.sequential:
        _print_sequential_design(study)


def _print_tuning_plan(study) -> None:
    """A study with `tune:`: the tuning trials that run first (study/tuning.py)."""
    from ..study import compile_study
    from ..study.tuning import tune_study

    tuning = tune_study(study)
    if tuning is None:
        return
    grid = "; ".join(f"{path} in {list(values)}" for path, values in study.tune.grid.items())
    trials = len(compile_study(tuning).trials)
    out.print(
        f"tuning first: {trials} trials as study {tuning.name!r} ({grid}; one seed each, scored on "
        f"{study.tune.metric.name} ({study.tune.metric.mode}) of the validation split); each cell then runs at its "
        "best point",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _print_sequential_design(study) -> None:
    """The design of a sequential study and the nominal level of each look it may take."""
    from ..analysis.sequential import Design

    design = Design.of(study.sequential)
    step = design.step or 1
    how = f"{step} seed{'s' if step > 1 else ''}"
    how = how if design.step else "1 seed (by default as many as fill the cluster's free slots)"
    table = Table(title=Text(f"sequential design: {design.describe()}"))
    for col in ("look", "seeds per cell", "information", "nominal one-sided level"):
        table.add_column(col, justify="right")
    for i, (seeds, t, level) in enumerate(design.planned_levels(step), 1):
        table.add_row(str(i), str(seeds), f"{t:.2f}", f"{level:.3g}")
    out.print(table)
    claims = len(study.claims)
    out.print(
        f"each look decides the {claims} claims from the finished seeds, then adds {how} per wave to the cells the "
        f"undecided claims select; levels assume every look adds {step} to every cell (information = seeds / max)",
        markup=False,
        highlight=False,
    )


@app.command()
@user_errors
def status(
    study: Annotated[str | None, typer.Argument(help="Study name (default: all studies).")] = None,
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
    stale_after: StaleOpt = None,
):
    """Trials per status, per study; then each failed or diverged trial with its class and first error line."""
    from ..store import STATUSES, TrialStatus
    from ..store.ledger import STALE_AFTER_S

    ws = open_workspace(workspace, db)
    ledger = read_ledger(ws)
    counts = ledger.status_counts(study, STALE_AFTER_S if stale_after is None else stale_after)
    if not counts:
        out.print("no studies in the ledger yet; run: studyrunner submit FILE")
        return
    table = Table()
    table.add_column("study")
    columns = (*STATUSES, "stale")
    for s in (*columns, "total"):
        table.add_column(s, justify="right")
    styles = {
        TrialStatus.SUCCEEDED: "green",
        TrialStatus.FAILED: "red",
        TrialStatus.RUNNING: "cyan",
        TrialStatus.PENDING: "yellow",
        TrialStatus.DIVERGED: "magenta",
        TrialStatus.CANCELLED: "dim",
        "stale": "bold red",  # not a status: unfinished trials whose holder is gone
    }
    for name, c in sorted(counts.items()):
        cells = [f"[{styles[s]}]{c[s]}[/]" if c[s] else "0" for s in columns]
        table.add_row(Text(name), *cells, str(sum(c.values())))
    out.print(table)
    for name in sorted(counts):
        _print_looks(ledger, name)
    _print_failures(ledger, sorted(counts))
    stale = {name: c["stale"] for name, c in counts.items() if c["stale"]}
    for name, n in sorted(stale.items()):
        out.print(f"{n} trials of {name} are stale (their submit died): {ws.hint('resume', name)}", markup=False)


def _print_looks(ledger, name: str) -> None:
    """A sequential study's current wave and each claim's state, from its looks."""
    from ..analysis import sequential
    from ..analysis.data import looks_of
    from ..errors import SpecError
    from ..study import loads

    try:
        study = loads(ledger.get_study(name).spec_text, source=f"<study {name} in the ledger>")
    except SpecError:
        return
    if study.sequential is None:
        return
    looks = sequential.looks_from_rows(looks_of(ledger, name))
    if not looks:
        out.print(f"{name}: sequential, wave 1 (the first {study.sequential.start} seeds of every cell); no look yet")
        return
    last = looks[-1]
    wave = f"wave {last.number + 1} ({sum(last.wave.values())} trials)"
    wave = "finished: no claim needs more seeds" if last.final else wave
    out.print(f"{name}: sequential, {len(looks)} looks; {wave}", markup=False, highlight=False)
    for c in last.claims:
        out.print(f"  {sequential.describe_state(c, last.next_seeds)}: {c.claim}", markup=False, highlight=False)


def _print_failures(ledger, studies: list[str], limit: int = 50) -> None:
    from ..store.status import UNSUCCESSFUL

    rows = [t for name in studies for t in ledger.trials(name, statuses=UNSUCCESSFUL)]
    if not rows:
        return
    table = Table(title="failed and diverged trials")
    for col in ("trial", "status", "class", "attempts", "first error line"):
        table.add_column(col, overflow="fold")
    for t in rows[:limit]:
        first = ((t.error or "").strip().splitlines() or [""])[0]
        table.add_row(Text(t.trial_key), t.status, t.failure_class or "", str(t.attempts), Text(first[:200]))
    out.print(table)
    if len(rows) > limit:
        out.print(f"... and {len(rows) - limit} more (studyrunner results STUDY --where ...)", markup=False)


class Format(StrEnum):
    table = "table"
    csv = "csv"
    parquet = "parquet"
    json = "json"


@app.command()
@user_errors
def results(
    study: Annotated[
        list[str] | None,
        typer.Argument(help="Study names [default: every study in the ledger].", show_default=False),
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            "--where",
            help="Keep the trials this holds for, e.g. 'loops >= 4 and eval_accuracy > 0.6' (the grammar of a "
            "study's failure: rule; names are columns: a metric, seed, model.params.loops or a unique leaf).",
        ),
    ] = None,
    format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    out_path: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write to this file instead of stdout (required for parquet).")
    ] = None,
    db: DbOpt = None,
    workspace: WorkspaceOpt = None,
):
    """One row per trial: identity, status, flattened config and final metrics (several studies: one after
    the other, columns joined)."""
    from ..results import filter_where, studies_frame

    if format is Format.parquet and out_path is None:
        raise StudyrunnerError("--format parquet writes a binary file: add --out PATH.parquet")
    if out_path is not None:
        _check_out_path(out_path)
    df = studies_frame(read_ledger(open_workspace(workspace, db)), study or [])
    if where is not None:
        df = filter_where(df, where, option="--where")
    try:
        if format is Format.parquet:
            df.to_parquet(out_path, index=False)
        elif format is Format.table:
            _print_results_table(df, out_path)
        else:
            text = (
                df.to_csv(index=False)
                if format is Format.csv
                else df.to_json(orient="records", indent=2, date_format="iso")
            )
            if out_path:
                out_path.write_text(text)
            else:
                sys.stdout.write(text)
    except OSError as exc:
        raise StudyrunnerError(f"--out: cannot write {str(out_path)!r}: {exc.strerror or exc}") from None
    if out_path:
        err.print(f"wrote {len(df)} rows to {out_path}", markup=False, highlight=False)


def _check_out_path(path: Path) -> None:
    """Before any work: --out names a file we can create, not a folder or a path in a missing folder."""
    if path.is_dir():
        raise StudyrunnerError(f"--out: {str(path)!r} is a folder; give a file name inside it")
    if not path.parent.is_dir():
        raise StudyrunnerError(f"--out: folder {str(path.parent)!r} does not exist; create it or choose another path")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise StudyrunnerError(f"--out: {str(path)!r} is not writable; choose another path")


def _cell_text(v) -> str:
    import pandas as pd

    if v is None or (not isinstance(v, list | tuple) and pd.isna(v)):
        return ""
    if isinstance(v, float):
        return f"{int(v):,}" if v.is_integer() and abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def _print_results_table(df, out_path: Path | None = None) -> None:
    from ..store.status import TrialStatus

    varied = [c for c in df.columns if "." in c and df[c].astype(str).nunique() > 1]
    metrics = [
        m
        for m in ("eval_accuracy", "eval_exact_match", "eval_loss", "train_loss", "params", "step_time_ms")
        if m in df.columns
    ]
    ids = ["study", "cell", "seed", "status"] if df.study.nunique() > 1 else ["cell", "seed", "status"]
    table = Table()
    for col in [*ids, *varied, *metrics]:
        table.add_column(col.rsplit(".", 1)[-1] if col in varied else col)
    for _, row in df.iterrows():
        table.add_row(*(Text(_cell_text(row[col])) for col in [*ids, *varied, *metrics]))
    failures = [
        Text.assemble((row.trial_key, "red"), ": ", str(row.error).splitlines()[0] if row.error else "?")
        for _, row in df[df.status == TrialStatus.FAILED].iterrows()
    ]
    if out_path is None:
        console = out
    else:  # plain text in the file: no colours, and as wide as the table needs
        console = Console(file=open(out_path, "w", encoding="utf-8"), width=100_000, color_system=None)  # noqa: SIM115
    try:
        console.print(table)
        for line in failures:
            console.print(line, highlight=False, soft_wrap=True)
    finally:
        if out_path is not None:
            console.file.close()
