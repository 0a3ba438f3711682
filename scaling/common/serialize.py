"""JSON text for results and logs (numpy scalars and arrays converted, NaN/inf written as null), and
the one generic dataclass <-> dict serializer of the result classes."""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import math
import types
import typing
from typing import Any, Mapping

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


# -- dataclasses <-> plain dicts ---------------------------------------------------------------
# One generic serializer for the frozen result dataclasses, instead of a hand-written
# to_dict/from_dict per class. Field metadata tunes a field: ``key`` (its name in the dict, e.g.
# "pass" for ``pass_``) and ``omit_none`` (left out of the dict when None). A class lists derived
# properties written after the fields in ``_computed`` (read back by nobody: from_dict ignores
# keys that are not fields).


def to_dict(obj: Any) -> Any:
    """``obj`` as plain Python: dataclasses as dicts (fields in order, then ``_computed``),
    tuples as lists, mappings as dicts; an object with its own ``to_dict`` is asked for it."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        own = getattr(type(obj), "to_dict", None)
        if own is not None and own is not Record.to_dict:
            return obj.to_dict()
        return _fields_dict(obj)
    if hasattr(obj, "to_dict") and not isinstance(obj, type):
        return obj.to_dict()
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def _fields_dict(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None and f.metadata.get("omit_none"):
            continue
        out[f.metadata.get("key", f.name)] = to_dict(value)
    for name in getattr(type(obj), "_computed", ()):
        out[name] = to_dict(getattr(obj, name))
    return out


def from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    """An instance of the dataclass ``cls`` from :func:`to_dict`'s output, each value converted
    to its field's annotated type (nested dataclasses, ``tuple[X, ...]``, ``X | None``, mappings,
    numbers). Missing keys take the field's default; unknown keys are ignored."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f.metadata.get("key", f.name)
        if key in data:
            kwargs[f.name] = _convert(hints[f.name], data[key])
    return cls(**kwargs)


def _convert(tp: Any, value: Any) -> Any:
    if tp is Any or value is None:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in value)
        return tuple(_convert(a, v) for a, v in zip(args, value)) if args else tuple(value)
    if origin in (dict, Mapping, collections.abc.Mapping):
        vt = args[1] if args else Any
        return {k: _convert(vt, v) for k, v in value.items()}
    if origin in (list, collections.abc.Sequence):
        return [_convert(args[0] if args else Any, v) for v in value]
    if isinstance(tp, type):
        if hasattr(tp, "from_dict"):
            return tp.from_dict(value)
        if dataclasses.is_dataclass(tp):
            return from_dict(tp, value)
        if tp in (float, int, str, bool):
            return tp(value)
    return value


class Record:
    """Mixin giving a frozen dataclass ``to_dict``/``from_dict`` by :func:`to_dict`/:func:`from_dict`."""

    def to_dict(self) -> dict[str, Any]:
        return _fields_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        return from_dict(cls, data)
