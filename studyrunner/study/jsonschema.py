"""JSON Schema for study files, with each registered family's and task's params spelled out."""

from __future__ import annotations

from typing import Any

from ..models import FAMILIES
from ..tasks import TASKS
from .schema import Study


def study_json_schema() -> dict[str, Any]:
    schema = Study.model_json_schema()
    defs = schema.setdefault("$defs", {})

    def variants(registry, name_key: str) -> list[dict[str, Any]]:
        out = []
        for name, entry in sorted(registry.items()):
            params = entry.params_model.model_json_schema()
            defs.update(params.pop("$defs", {}))
            out.append(
                {
                    "type": "object",
                    "properties": {name_key: {"const": name}, "params": params},
                    "required": [name_key],
                    "additionalProperties": False,
                }
            )
        return out

    schema["properties"]["model"] = {"anyOf": variants(FAMILIES, "family")}
    schema["properties"]["task"] = {"anyOf": variants(TASKS, "name")}
    for unused in ("ModelSection", "TaskSection"):
        defs.pop(unused, None)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "studyrunner study file"
    return schema
