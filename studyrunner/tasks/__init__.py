"""Generated tasks. Importing this package registers every built-in task."""

from . import addition, charlm, igsm, mqar, phop, recall, sudoku, text, var_assign  # noqa: F401  (registration side effect)
from .base import Batch, Task, TaskFacts
from .registry import TASKS, build_task, get_task, register_task

__all__ = ["TASKS", "Batch", "Task", "TaskFacts", "build_task", "get_task", "register_task"]
