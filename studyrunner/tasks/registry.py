"""Task registry: a task is a name, a pydantic params model and a factory.

A new task registers itself here; the study loader and `plan` find it without changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from ..registry import Registry
from .base import Task

TaskFactory = Callable[[BaseModel, int], Task]


@dataclass(frozen=True)
class TaskEntry:
    name: str
    params_model: type[BaseModel]
    factory: TaskFactory  # (validated params, trial seed) -> Task


TASKS: Registry[TaskEntry] = Registry("task")
get_task = TASKS.get


def register_task(name: str, params_model: type[BaseModel]) -> Callable[[TaskFactory], TaskFactory]:
    def decorator(factory: TaskFactory) -> TaskFactory:
        TASKS.add(name, TaskEntry(name, params_model, factory))
        return factory

    return decorator


def build_task(name: str, params: dict | BaseModel, seed: int) -> Task:
    entry = get_task(name)
    if not isinstance(params, entry.params_model):
        params = entry.params_model.model_validate(params)
    return entry.factory(params, seed)
