"""Base for callbacks that live only in the submitting process."""

from ray.tune import Callback


class DriverCallback(Callback):
    """Tune pickles its run config, callbacks included, into the experiment folder for
    `Tuner.restore`. Ours hold live connections (database, MLflow, terminal), so they pickle as inert
    shells: resuming a study is the ledger's job (resubmit runs what has not succeeded), not Tune's."""

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
