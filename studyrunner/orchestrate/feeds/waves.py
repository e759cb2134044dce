"""A sequential study's waves (`seeds: {start, max}`): analysis/sequential/ decides, this runs the seeds.

`submit` registers and runs the first `start` seeds of every cell. When every trial of a wave has been recorded,
the feed (feed.py) takes a look: one call into the analysis (`take_look`) decides every claim from the ledger's
trials, and the look, its claims' rows and the trials of the next wave (the next seeds, in order, of the cells
the undecided claims select) are written in one transaction. The new trials are leased and queued in the same
Ray Tune run, whose workers are reused (`reuse_actors`), so a wave costs no start-up. It stops when a look adds
no seeds: every claim decided, futile or at `max`.

What survives a crash (`kill -9` at any moment) is the ledger's: a look is recorded with its wave or not at all.
`resume` and `submit` run the registered trials that have not finished, then take the next look, from the same
finished trials an uninterrupted run had: decisions are replayed from the rows, never taken again on other data.
A look waits until every trial of its wave has finished; a trial that failed (an error, retries spent) blocks
it, and the run says so and how to go on (`rerun --failed`, then `resume`). `rerun` never takes a look, so a
rerun seed changes no decided look. Like a search, a sequential study runs from one submit at a time.
"""

from __future__ import annotations

from collections.abc import Callable

from ...analysis import sequential
from ...analysis.data import from_ledger, looks_of
from ...analysis.sequential import changed_claim_fields, claim_entries
from ...errors import StudyrunnerError
from ...store import Ledger
from ...store.status import FINISHED
from ...study import CompiledStudy, trial_key
from ...study.compiler import with_seeds
from ...tracking.tracker import RunHistory
from ...tracking.ui_links import study_run
from ..cluster.faults import kill_driver_at
from .feed import TrialFeed

# a claim's state as an MLflow metric: +1 supported, -1 contradicted, 0 otherwise
STATE_VALUE = {sequential.ClaimState.SUPPORTED: 1.0, sequential.ClaimState.CONTRADICTED: -1.0}


def with_registered_seeds(compiled: CompiledStudy, ledger: Ledger) -> CompiledStudy:
    """A sequential study with the trials of the waves the ledger registered (seeds in order, up to max)."""
    design = compiled.study.sequential
    if design is None:
        return compiled
    cells = {c.cell_hash for c in compiled.cells}
    counts: dict[str, int] = {}
    for row in ledger.trials(compiled.study.name):
        if row.cell_hash in cells and row.seed < design.max:
            counts[row.cell_hash] = max(counts.get(row.cell_hash, 0), row.seed + 1)
    return with_seeds(compiled, counts)


class Waves(TrialFeed):
    """One submit's share of a sequential study: the registered trials it runs first, then a wave per look. A feed
    of a `StudyRun` (commands/study_run.py): its looks are read in `prepare`, once the study is this submit's."""

    taken_as = "sequential study"  # its looks follow one another: one submit runs its waves at a time
    brings = "a wave after each look"
    says_plan = True

    def __init__(self, compiled: CompiledStudy, ledger: Ledger, say: Callable[[str], None]) -> None:
        super().__init__()
        self.ledger, self.say = ledger, say
        self.study = compiled.study
        self.name = self.study.name
        self.design = sequential.Design.of(self.study.sequential)
        self.compiled = compiled
        self.rows: list[dict] = []
        self.looks: list[sequential.Look] = []
        self.blocked: list[str] = []  # failed trials of the wave: the next look waits for them
        self.on_look: Callable[[list[sequential.Look]], None] | None = None  # MLflow (`tracked`)

    def check(self, refuse: Callable[[CompiledStudy], None]) -> None:
        """Nothing before the study is taken: its looks are read once no other submit can add one."""

    def prepare(self, refuse: Callable[[CompiledStudy], None]) -> None:
        """Read the looks and the waves registered so far; refuse an edit of the design or the claims after a
        look (`check_design`), then one that changes cells that ran (`refuse`)."""
        self.rows = looks_of(self.ledger, self.name)
        self.looks = sequential.looks_from_rows(self.rows)
        self.compiled = with_registered_seeds(self.compiled, self.ledger)
        self.blocked = self.wave_state()[0]
        self.check_design()
        refuse(self.compiled)

    def tracked(self, tracker, experiment_id: str, call) -> None:
        self.on_look = LookLog(tracker, experiment_id, self.name, call)

    def check_design(self) -> None:
        """Refuse an edit of the design or the claims after the first look: the error control rests on them."""
        if not self.rows:
            return
        first = self.rows[0]
        was = sequential.design_of(first["design"])
        now = self.design
        changed = [f"seeds.{k}" for k in ("start", "max", "step", "spending") if getattr(was, k) != getattr(now, k)]
        if [text for text, _ in sequential.claim_specs(self.study)] != first["texts"]:
            changed.append("claims")
        else:  # every field of every claim entry (min_effect, ...), where the first look recorded them
            changed += changed_claim_fields(first["design"], self.study)
        if changed:
            fields = ", ".join(changed)
            raise StudyrunnerError(
                f"{self.study.source}: study {self.name!r} has taken {len(self.rows)} looks with its recorded "
                f"{fields}; changing them changes the error control the looks rest on. Submit the edited file as "
                f"a new study: studyrunner submit {self.study.source} --as-new-study NAME"
            )

    @property
    def last(self) -> sequential.Look | None:
        return self.looks[-1] if self.looks else None

    def can_ask(self) -> bool:
        """Looks are taken while the last one added seeds and no failed trial blocks the next (a study without
        claims takes none)."""
        return bool(self.study.claims) and not self.blocked and not (self.last is not None and self.last.final)

    def plan(self) -> str:
        done = f"{len(self.looks)} looks taken" if self.looks else "no look yet"
        if self.last is not None and self.last.final:
            done += " (the last one added no seeds: finished)"
        return f"sequential {self.design.describe()}; {done}"

    # --- the looks ------------------------------------------------------------------------------------

    def wave_state(self) -> tuple[list[str], list[str]]:
        """(failed trials, unfinished trials) of the study's registered trials."""
        rows = [r for r in self.ledger.trials(self.name) if self._ours(r)]
        failed = [r.trial_key for r in rows if r.status == "failed" or r.trial_key in self._errored]
        return failed, [r.trial_key for r in rows if r.status not in FINISHED]

    def _ours(self, row) -> bool:
        return row.seed < self.design.max and any(c.cell_hash == row.cell_hash for c in self.compiled.cells)

    def refill(self) -> bool:
        """The next look, once every trial sent has ended and every registered one has finished."""
        if self._running or not self.can_ask():
            return False
        self.blocked, unfinished = self.wave_state()
        if self.blocked or unfinished:
            return False
        return bool(self.take_look())

    def take_look(self) -> list:
        """Decide the claims on the ledger's trials; record the look with the next wave's trials; queue them."""
        data = from_ledger(self.ledger, self.study)
        cells = [c.cell_hash for c in self.compiled.cells]
        data.trials = data.trials[data.trials.cell_hash.isin(cells) & (data.trials.seed < self.design.max)]
        data.cells_order = [c for c in cells if c in set(data.trials.cell_hash)]
        look = sequential.take_look(
            data, self.design, self.looks, slots=self.slots, multiplicity=self.study.multiplicity or "none"
        )
        new = [
            (trial_key(self.name, cell, seed), cell, seed)
            for cell, n in look.next_seeds.items()
            for seed in range(look.seeds.get(cell, 0), n)
        ]
        self.ledger.record_look(
            self.name,
            sequential.look_row(look, self.design, claim_entries(self.study)),
            [sequential.claim_row(c) for c in look.claims],
            new,
        )
        for key, _, _ in new:  # fault injection (cluster/faults.py): a driver killed between the look and its wave
            kill_driver_at("look", key)
        self.looks.append(look)
        self.compiled = with_seeds(self.compiled, look.next_seeds)
        self.say(self.describe(look))
        if self.on_look is not None:
            self.on_look(self.looks)
        queued = []
        added = {key for key, _, _ in new}
        for cell in self.compiled.cells:
            trials = [t for t in self.compiled.trials if t.cell_hash == cell.cell_hash and t.trial_key in added]
            if trials:
                queued += self.run_new(cell, trials)
        return queued

    def describe(self, look: sequential.Look) -> str:
        """'look 3: claim 2 supported at look 3, 5 seeds; 3 cells still sampling (wave 4: 6 trials)'."""
        parts = [
            sequential.describe_state(c, look.seeds)
            for c in look.claims
            if c.decided_at == look.number and c.state in sequential.TERMINAL
        ]
        trials = sum(look.wave.values())
        if look.final:
            parts.append("no claim needs more seeds: done")
        else:
            cells = f"{len(look.wave)} cell{'s' if len(look.wave) != 1 else ''}"
            parts.append(f"{cells} still sampling (wave {look.number + 1}: {trials} trials)")
        return f"look {look.number} ({sum(look.seeds.values())} trials): " + "; ".join(parts)

    def summary(self) -> list[str]:
        """What the looks decided, for the end of `submit`; or what the next look waits for."""
        lines = []
        if self.blocked:
            n = len(self.looks) + 1
            lines.append(
                f"look {n} waits for {len(self.blocked)} failed trials of its wave ({', '.join(self.blocked[:3])}"
                f"{', ...' if len(self.blocked) > 3 else ''}): studyrunner rerun {self.name} --failed, then "
                f"studyrunner resume {self.name}"
            )
        if self.last is None:
            return lines
        seeds = self.last.next_seeds
        for c in self.last.claims:
            lines.append(f"{sequential.describe_state(c, seeds)}: {c.claim}")
        per_cell = sorted(set(seeds.values()))
        span = f"{per_cell[0]}" if len(per_cell) == 1 else f"{per_cell[0]}-{per_cell[-1]}"
        state = "finished" if self.last.final else "not finished (submit or resume to go on)"
        lines.append(
            f"sequential: {len(self.looks)} looks, {span} seeds per cell, {sum(seeds.values())} trials; {state}"
        )
        return lines


class LookLog:
    """A sequential study's looks on its MLflow run (kind=study, the report's run too): per claim i, metrics
    claim_{i}_p, _nominal, _boundary, _z, _fraction, _seeds and _state (1 supported, -1 contradicted, else 0) at
    step = look, and tags claim_{i} (its text) and claim_{i}_state. Each point once: the first call of a submit
    logs what MLflow lacks of every look (a resumed study's), later ones the new look, in one batch. `call`:
    the recorder's MlflowGuard.call, so MLflow being down never stops the study."""

    def __init__(self, tracker, experiment_id: str, study: str, call) -> None:
        self.tracker, self.experiment_id, self.study, self.call = tracker, experiment_id, study, call
        self.history: RunHistory | None = None

    def __call__(self, looks: list[sequential.Look]) -> None:
        from mlflow.entities import RunTag

        if self.history is None:
            ok, run_id = self.call(study_run, self.tracker.client, self.experiment_id, self.study)
            if not ok or run_id is None:
                return  # the ledger has the looks; the next submit's first look logs them
            self.history = RunHistory(self.tracker.client, run_id)
        points: dict[str, dict[int, float]] = {}
        for look in looks:
            points.setdefault("looks_trials", {})[look.number] = float(sum(look.seeds.values()))
            for c in look.claims:
                values = {
                    "p": c.p_claimed,
                    "nominal": c.nominal,
                    "boundary": c.boundary,
                    "z": c.z,
                    "fraction": c.fraction,
                    "seeds": float(c.seeds),
                    "state": STATE_VALUE.get(c.state, 0.0),
                }
                for name, value in values.items():
                    if value == value and abs(value) != float("inf"):
                        points.setdefault(f"claim_{c.index + 1}_{name}", {})[look.number] = float(value)
        ok, _ = self.call(self.history.log_missing, points)
        if not ok:
            self.history = None  # fetch what MLflow holds again next time
            return
        tags = [RunTag("sequential_looks", str(len(looks)))]
        for c in looks[-1].claims:
            state = c.state if c.decided_at is None else f"{c.state} at look {c.decided_at}"
            tags += [RunTag(f"claim_{c.index + 1}", c.claim[:5000]), RunTag(f"claim_{c.index + 1}_state", state)]
        self.call(self.tracker.client.log_batch, self.history.run_id, tags=tags)
        if looks[-1].final:
            self.call(self.tracker.client.set_terminated, self.history.run_id, "FINISHED")
