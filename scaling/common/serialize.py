"""JSON text for results and logs: numpy scalars and arrays converted, NaN/inf written as null."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


def jsonable(obj: Any) -> Any:
    """``obj`` with numpy values as Python ones and non-finite floats as None (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def to_json(obj: Any, indent: int | None = 2) -> str:
    """JSON text with numpy scalars converted and NaN/inf written as null."""
    return json.dumps(jsonable(obj), indent=indent, allow_nan=False)
