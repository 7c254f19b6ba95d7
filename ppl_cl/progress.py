"""Progress bars for long loops (tqdm), silenced in CI logs unless asked for.

``PPL_CL_PROGRESS=1`` forces bars on, ``PPL_CL_PROGRESS=0`` off; by default they show when
stderr is a terminal.
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
__all__ = ["progress", "progress_enabled"]


def progress_enabled() -> bool:
    flag = os.environ.get("PPL_CL_PROGRESS")
    if flag is not None:
        return flag.strip().lower() not in ("0", "false", "no", "off", "")
    return sys.stderr.isatty()


def progress(iterable: Iterable[T] | None = None, *, desc: str = "", total: int | None = None,
             enabled: bool | None = None, **kwargs) -> "tqdm[T]":
    """A tqdm bar over ``iterable`` (or a manual bar when ``iterable`` is None)."""
    on = progress_enabled() if enabled is None else enabled
    return tqdm(iterable, desc=desc, total=total, disable=not on, leave=False,
                dynamic_ncols=True, **kwargs)
