"""Task registry: a task is a name, a pydantic params model and a factory.

A new task registers itself here; the study loader and `plan` find it without changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from .base import Task

TaskFactory = Callable[[BaseModel, int], Task]


@dataclass(frozen=True)
class TaskEntry:
    name: str
    params_model: type[BaseModel]
    factory: TaskFactory  # (validated params, trial seed) -> Task


TASKS: dict[str, TaskEntry] = {}


def register_task(name: str, params_model: type[BaseModel]) -> Callable[[TaskFactory], TaskFactory]:
    def decorator(factory: TaskFactory) -> TaskFactory:
        if name in TASKS:
            raise ValueError(f"task {name!r} is registered twice")
        TASKS[name] = TaskEntry(name, params_model, factory)
        return factory

    return decorator


def get_task(name: str) -> TaskEntry:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; valid: {', '.join(sorted(TASKS))}") from None


def build_task(name: str, params: dict | BaseModel, seed: int) -> Task:
    entry = get_task(name)
    if not isinstance(params, entry.params_model):
        params = entry.params_model.model_validate(params)
    return entry.factory(params, seed)
