"""Base for callbacks that live only in the submitting process."""

from ray.tune import Callback, Stopper


class DriverCallback(Callback):
    """Tune pickles its run config, callbacks included, into the experiment folder for
    `Tuner.restore`. Ours hold live connections (database, MLflow, terminal), so they pickle as inert
    shells: resuming a study is the ledger's job (resubmit runs what has not succeeded), not Tune's."""

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


class CancelStopper(Stopper):
    """Stops the whole Tune run when `event` is set (`studyrunner cancel` from another terminal)."""

    def __init__(self, event) -> None:
        self.event = event

    def __call__(self, trial_id, result) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.event is not None and self.event.is_set()

    def __getstate__(self) -> dict:  # pickled with the run config, like the callbacks
        return {"event": None}
