"""One trial: build the task and model, train, evaluate, report."""

from .reporter import MemoryReporter, Reporter
from .trainer import evaluate, run_trial

__all__ = ["MemoryReporter", "Reporter", "evaluate", "run_trial"]
