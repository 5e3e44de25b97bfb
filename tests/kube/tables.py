"""Server-side `Table` rendering, so `kubectl get` shows a CRD's additionalPrinterColumns.

kubectl asks for `Accept: application/json;as=Table;g=meta.k8s.io;v=v1`; a real API server renders
the CRD's printer columns (JSONPath) and turns `date` columns into ages ("5m").
"""

from __future__ import annotations

import datetime
import re
from typing import Any

_INDEX = re.compile(r"^(\w[\w-]*)?\[(\d+)\]$")


def json_path(obj: Any, path: str) -> Any:
    """The simple JSONPath subset printer columns use: `.status.best.strategy`, `.items[0].name`."""
    current = obj
    for part in path.strip().lstrip(".").split("."):
        if not part:
            continue
        indexed = _INDEX.match(part)
        if indexed:
            name, index = indexed.groups()
            current = current.get(name) if name and isinstance(current, dict) else current
            current = current[int(index)] if isinstance(current, list) and int(index) < len(current) else None
        else:
            current = current.get(part) if isinstance(current, dict) else None
    return current


def human_age(timestamp: str | None) -> str:
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = int((datetime.datetime.now(datetime.UTC) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _cell(value: Any, column_type: str) -> Any:
    if value is None:
        return None
    if column_type == "date":
        return human_age(str(value))
    return value


def maybe_table(request: Any, items: list[dict], crd_version: dict | None, single: bool) -> Any:
    """Return a meta.k8s.io/v1 Table when the client asked for one, else the objects unchanged."""
    accept = request.headers.get("Accept", "")
    if "as=Table" not in accept:
        return items[0] if single else items
    columns = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}]
    printer = (crd_version or {}).get("additionalPrinterColumns") or [
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    ]
    columns += [
        {"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
         "description": c.get("description", ""), "priority": c.get("priority", 0)}
        for c in printer
    ]
    rows = [
        {"cells": [item["metadata"]["name"]] + [_cell(json_path(item, c["jsonPath"]), c.get("type", "")) for c in printer],
         "object": item}
        for item in items
    ]
    return {"apiVersion": "meta.k8s.io/v1", "kind": "Table", "metadata": {}, "columnDefinitions": columns,
            "rows": rows}
