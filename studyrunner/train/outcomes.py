"""How a trial can end besides finishing: diverging.

A diverged seed is a data point of the study (the cell is unstable at that setting), not a failure to
retry, so it carries the metrics known when it stopped."""

from __future__ import annotations


class Diverged(Exception):
    """The trial stopped at `step` because training diverged: a non-finite train loss (raised by the
    trainer) or the study's `divergence:` rule holding on a record (raised by the caller's reporter).

    `metrics` are the latest value of every reported name plus the static facts and throughput so far
    (`trainer.summary_metrics`); a reporter raising it leaves them None and `run_trial` fills them in."""

    def __init__(self, step: int, reason: str, metrics: dict[str, float] | None = None) -> None:
        super().__init__(reason)
        self.step, self.reason, self.metrics = step, reason, metrics

    def __reduce__(self):  # keep step and metrics when pickled (Ray ships exceptions between processes)
        return (Diverged, (self.step, self.reason, self.metrics))
