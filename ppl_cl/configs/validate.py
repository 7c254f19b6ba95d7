"""The validators every config shares: one function per rule, one message style.

Every message reads ``"<name>: expected <what>, received <value!r>"`` (the field, or the
command-line option, first), so a bad ``--set`` or constructor argument reads the same for
every method. The config dataclasses of :mod:`ppl_cl.configs` call these from their
``__post_init__``; :mod:`ppl_cl.experiments.base` and :mod:`ppl_cl.sweep` check ``--device``
with :func:`check_device_name`. Standard library only, like the configs.
"""

from __future__ import annotations

import math
import typing
from typing import Any

__all__ = ["positive", "int_at_least", "one_of", "check_positive", "check_ints",
           "check_choices", "check_device_name", "is_device_name", "DEVICES"]

#: the device strings every config and command accepts, in words
DEVICES = "cpu, cuda or cuda:N"


def positive(name: str, value: Any, *, allow_zero: bool = False,
             allow_none: bool = False) -> None:
    """``ValueError`` unless ``value`` is a finite number > 0 (>= 0 with ``allow_zero``; or
    None with ``allow_none``)."""
    if value is None and allow_none:
        return
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) \
        and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ValueError(f"{name}: expected a finite number {'>=' if allow_zero else '>'} 0, "
                         f"received {value!r}")


def int_at_least(name: str, value: Any, minimum: int = 1, *, allow_none: bool = False) -> None:
    """``ValueError`` unless ``value`` is an int (not a bool) >= ``minimum`` (or None with
    ``allow_none``)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, received {value!r}")


def one_of(name: str, value: Any, options: tuple) -> None:
    """``ValueError`` unless ``value`` is one of ``options``."""
    if value not in options:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, options))}, received "
                         f"{value!r}")


def check_positive(config: Any, *names: str, allow_zero: bool = False) -> None:
    """:func:`positive` for each field of ``names``; for a config's ``__post_init__``."""
    for name in names:
        positive(name, getattr(config, name), allow_zero=allow_zero)


def check_ints(config: Any, *names: str, minimum: int = 1) -> None:
    """:func:`int_at_least` for each field of ``names``."""
    for name in names:
        int_at_least(name, getattr(config, name), minimum)


def check_choices(config: Any) -> None:
    """:func:`one_of` for every ``Literal``-typed field of ``config``."""
    for name, typ in typing.get_type_hints(type(config)).items():
        if typing.get_origin(typ) is typing.Literal:
            one_of(name, getattr(config, name), typing.get_args(typ))


def is_device_name(device: Any) -> bool:
    """Whether ``device`` is ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (N a non-negative int)."""
    return isinstance(device, str) and (
        device in ("cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit()))


def check_device_name(device: Any, name: str = "device",
                      error: type[Exception] = ValueError) -> str:
    """``device`` if it names a device (:func:`is_device_name`), else ``error`` (a
    ``ValueError`` for configs; the commands pass :class:`ppl_cl.errors.DeviceError` and
    ``name="--device"``). Whether that GPU is present is checked where it is used
    (:func:`ppl_cl.experiments.base.check_device`)."""
    if not is_device_name(device):
        raise error(f"{name}: expected {DEVICES}, received {device!r}")
    return device
