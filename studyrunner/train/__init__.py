"""One trial: build the task and model, train, evaluate, report."""

from .outcomes import Diverged
from .reporter import MemoryReporter, Reporter
from .trainer import evaluate, run_trial

__all__ = ["Diverged", "MemoryReporter", "Reporter", "evaluate", "run_trial"]
