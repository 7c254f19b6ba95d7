"""One frozen config dataclass per learner, and the helpers every config shares.

Each method's module here (``ppl_cl.configs.vargp``, ``ppl_cl.configs.kalman``, ...) holds the
frozen dataclass its learner takes; its defaults are the validated settings, each documented
with the paper section or the authors' file it follows. The modules import only the standard
library, so an experiment's config (which holds a learner config) can be built, printed and
parsed without loading torch or JAX (``ppl-cl list``, ``ppl-cl run --set learner.beta=10``).

Helpers:

* :func:`make_config` — ``config`` (an instance or None for the defaults) with keyword
  overrides, type-checked field by field;
* :func:`to_dict` / :func:`from_dict` — a config as JSON values and back (nested dataclasses,
  tuples), for ``config.json`` and checkpoints;
* :func:`parse_value` / :func:`apply_overrides` — the ``--set key=value`` strings of the CLI,
  with dotted keys into nested configs (``learner.beta=10``);
* :mod:`ppl_cl.configs.validate` — the field checks every config's ``__post_init__`` uses
  (one message style), re-exported here, and the one check of a device string.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

from ppl_cl.configs.validate import (check_choices, check_device_name, check_ints,
                                    check_positive)
from ppl_cl.errors import ConfigError

__all__ = ["ConfigError", "make_config", "to_dict", "from_dict", "parse_value",
           "apply_overrides", "field_names", "check_positive", "check_ints", "check_choices",
           "check_device_name", "CHECKPOINT_EVERY_S"]

#: seconds between the checkpoints of a run and the within-task snapshots of a learner
#: (``ppl-cl run --checkpoint-every``, ``ppl-cl sweep``, ``VARGP.update(snapshot_every_s=)``)
CHECKPOINT_EVERY_S = 600.0


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def make_config(cls: type, config: Any = None, overrides: dict[str, Any] | None = None) -> Any:
    """``cls()`` (or ``config``, an instance of ``cls``) with ``overrides`` replacing fields.

    Raises:
        TypeError: ``config`` is not a ``cls`` or an override names no field of ``cls``.
    """
    if config is None:
        config = cls()
    elif not isinstance(config, cls):
        raise TypeError(f"config: expected a {cls.__name__}, received {type(config).__name__}")
    if overrides:
        unknown = sorted(set(overrides) - set(field_names(cls)))
        if unknown:
            raise TypeError(f"{cls.__name__}: unknown setting(s) {unknown}; settings: "
                            f"{', '.join(field_names(cls))}")
        config = dataclasses.replace(config, **overrides)
    return config


def to_dict(config: Any) -> dict[str, Any]:
    """A (nested) config dataclass as JSON values (tuples become lists)."""
    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {str(k): conv(x) for k, x in v.items()}
        return v

    return conv(config)


def _coerce(value: Any, typ: Any) -> Any:
    """A JSON value back to the annotated type (nested dataclasses, tuples)."""
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if dataclasses.is_dataclass(typ) and isinstance(value, dict):
        return from_dict(typ, value)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        for a in args:
            if a is not type(None) and dataclasses.is_dataclass(a) and isinstance(value, dict):
                return from_dict(a, value)
        for a in args:                       # Optional[tuple[...]]: a JSON list is the tuple
            if (typing.get_origin(a) is tuple or a is tuple) and isinstance(value, list):
                return _coerce(value, a)
        return value
    if (origin is tuple or typ is tuple) and isinstance(value, list):
        inner = args[0] if args and args[-1] is Ellipsis else None
        return tuple(_coerce(v, inner) if inner is not None else v for v in value)
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def from_dict(cls: type, values: dict[str, Any], *, strict: bool = True) -> Any:
    """Rebuild ``cls`` from :func:`to_dict`'s output (``strict``: unknown keys are an error)."""
    hints, names = _hints(cls), set(field_names(cls))
    unknown = sorted(set(values) - names)
    if unknown and strict:
        raise ConfigError(f"{cls.__name__}: unknown setting(s) {unknown}")
    return cls(**{k: _coerce(v, hints[k]) for k, v in values.items() if k in names})


def _type_name(typ: Any) -> str:
    if isinstance(typ, type):
        return typ.__name__
    if typing.get_origin(typ) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(typ))
    return str(typ).replace("typing.", "")


def parse_value(text: str, typ: Any, key: str) -> Any:
    """Read the ``--set`` string ``text`` as the field type ``typ`` (bool, int, float, str,
    Literal, tuple/list of those, Optional). Raises :class:`ConfigError` naming the key, the
    expected type and the text."""
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):
        if text.strip().lower() in ("none", "null"):
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return parse_value(text, a, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(f"--set {key}={text}: expected {_type_name(typ)}, received {text!r}")
    try:
        if origin is typing.Literal:
            for a in args:
                if str(a) == text.strip():
                    return a
            raise ValueError(text)
        if typ is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if typ is int:
            return int(text)
        if typ is float:
            return float(text)
        if typ is str:
            return text
        if origin in (tuple, list) or typ in (tuple, list):
            try:
                val = json.loads(text)
            except json.JSONDecodeError:
                # shell-friendly forms: a,b,c  [a,b,c]  [a, 'b']  (no JSON quoting needed)
                body = text.strip()
                if body.startswith("[") and body.endswith("]"):
                    body = body[1:-1]
                val = [v.strip().strip("'\"") for v in body.split(",")]
                val = [v for v in val if v != ""]
            if not isinstance(val, list):
                val = [val]
            inner = args[0] if args and args[0] is not Ellipsis else None
            if inner is not None:
                val = [parse_value(str(v), inner, key) if isinstance(v, str) or inner in (int, float)
                       else v for v in val]
            return tuple(val) if (origin is tuple or typ is tuple) else list(val)
        return json.loads(text)
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--set {key}={text}: expected {_type_name(typ)}, received "
                          f"{text!r}") from exc


def apply_overrides(config: Any, overrides: dict[str, Any], *, where: str = "",
                    prefix: str = "") -> Any:
    """``config`` with ``--set`` overrides (``key`` or dotted ``learner.key``; string values are
    parsed by the field's type, other values used as they are). Unknown keys raise
    :class:`ConfigError` listing the valid ones; bad values are reported by the config's own
    checks as :class:`ConfigError` too."""
    cls = type(config)
    hints = _hints(cls)
    names = field_names(cls)
    direct: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        if head not in names:
            raise ConfigError(f"{where or cls.__name__}: unknown config key {key!r}; keys: "
                              f"{', '.join(names)}")
        if rest:
            sub = getattr(config, head)
            if not dataclasses.is_dataclass(sub):
                raise ConfigError(f"{where or cls.__name__}: {head!r} has no settings of its own "
                                  f"({key!r})")
            nested.setdefault(head, {})[rest] = value
        else:
            direct[key] = parse_value(value, hints[key], prefix + key) \
                if isinstance(value, str) else value
    for head, sub_over in nested.items():
        direct[head] = apply_overrides(getattr(config, head), sub_over,
                                       where=f"{where + '.' if where else ''}{head}",
                                       prefix=f"{prefix}{head}.")
    try:
        return dataclasses.replace(config, **direct)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{where or cls.__name__}: {err}") from err
