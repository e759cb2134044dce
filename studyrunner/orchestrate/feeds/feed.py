"""Trials that become known while a study runs, fed to one Ray Tune run: a search's suggestions (search.py) and a
sequential study's waves (waves.py).

Tune asks its Searcher for a trial whenever a slot is free. The feed hands out the payloads it has queued; when
the queue is empty it asks `refill` for more (a new suggestion, the next wave after a look), answers None (wait:
Tune asks again as trials end) while trials it sent are still running, and FINISHED once nothing can come. New
trials are leased in the ledger (`lease`, set by the StudyRun) before they are queued, so two processes never run
one, and `admit` readies the recorder and the progress display for them. Its state is the ledger's, so Tune's
experiment checkpoints hold none of it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ray.tune.search import Searcher

from ...study import Trial
from ...study.compiled import Cell


class TrialFeed:
    """The queue behind the Searcher Tune runs. Subclasses say how to `refill` it and what a finished trial
    means (`finished`)."""

    def __init__(self) -> None:
        self._queue: deque[dict] = deque()
        self._sent: set[str] = set()  # trial keys given to Tune by this run
        self._running: set[str] = set()  # ... and not ended yet
        self._errored: set[str] = set()  # ended by an error Tune gave up on (the ledger records it failed next)
        self._by_tune_id: dict[str, list[str]] = {}
        self._payloads: Callable[[list[Trial]], list[dict]] | None = None
        self._admit: Callable[[Cell, list[Trial]], None] | None = None
        self.lease: Callable[[list[str]], set[str]] | None = None  # trial keys -> those this submit now holds
        self.admitted: list[Trial] = []  # trials this run learnt of and sent to Tune
        self.slots = 1  # trials the cluster holds at once (the runner sets it)

    # --- what a feed says ---------------------------------------------------------------------------------

    def can_ask(self) -> bool:
        """May the run bring trials beyond those it starts with?"""
        return False

    def refill(self) -> bool:
        """Queue more trials now (True: call again if the queue is still empty), or say there are none now."""
        return False

    def finished(self, keys: list[str], error: bool) -> None:
        """A Tune trial running `keys` ended (`error`: Tune gave up on it)."""

    def tracked(self, tracker, experiment_id: str, call) -> None:
        """The study's MLflow experiment is open (`call`: the recorder's MlflowGuard.call), for a feed that logs
        to it."""

    # --- Ray Tune -----------------------------------------------------------------------------------------

    def searcher(
        self,
        first: list[Trial],
        *,
        payloads: Callable[[list[Trial]], list[dict]],
        admit: Callable[[Cell, list[Trial]], None],
    ) -> Searcher:
        """The Searcher Tune runs: the trials the submit claimed (`first`), then what `refill` brings. `payloads`
        makes Tune configs of trials; `admit` readies the recorder for a cell's new trials."""
        self._payloads, self._admit = payloads, admit
        self._enqueue(first)
        return _TuneSearcher(self)

    def _enqueue(self, trials: list[Trial]) -> None:
        trials = [t for t in trials if t.trial_key not in self._sent]
        self._sent.update(t.trial_key for t in trials)
        self._queue.extend(self._payloads(trials) if trials else [])

    def run_new(self, cell: Cell, trials: list[Trial]) -> list[Trial]:
        """Lease a cell's new trials, ready the recorder for them and queue those this submit now holds."""
        claimed = self.lease([t.trial_key for t in trials])
        runnable = [t for t in trials if t.trial_key in claimed and t.trial_key not in self._sent]
        if runnable:
            self._admit(cell, runnable)
            self.admitted.extend(runnable)
            self._enqueue(runnable)
        return runnable

    def suggest(self, tune_id: str) -> dict | str | None:
        while not self._queue:
            if not self.refill():
                # Nothing more now: done, unless running trials may bring more (or free a slot).
                return None if self._running else Searcher.FINISHED
        payload = self._queue.popleft()
        keys = [m["trial_key"] for m in payload["group"]] if "group" in payload else [payload["trial_key"]]
        self._by_tune_id[tune_id] = keys
        self._running.update(keys)
        return {"trial": payload}

    def trial_done(self, tune_id: str, error: bool) -> None:
        keys = self._by_tune_id.pop(tune_id, [])
        self._running.difference_update(keys)
        if error:  # Tune gave up on it; the recorder marks it failed right after this
            self._errored.update(keys)
        self.finished(keys, error)


class _TuneSearcher(Searcher):
    """What Ray Tune asks for trials (`TrialFeed.suggest`) and tells of their ends (`TrialFeed.trial_done`)."""

    def __init__(self, feed: TrialFeed) -> None:
        super().__init__()
        self._feed = feed

    def suggest(self, trial_id: str) -> dict | str | None:
        return self._feed.suggest(trial_id)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self._feed.trial_done(trial_id, error)

    def save(self, checkpoint_path: str) -> None:  # nothing to save: resubmitting continues
        pass

    def restore(self, checkpoint_path: str) -> None:
        pass

    def __getstate__(self) -> dict:  # Tune pickles its config; ours holds live database connections
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
