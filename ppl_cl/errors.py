"""Errors that ``ppl-cl`` turns into one-line messages and exit statuses.

A module of its own, importing nothing, so that :func:`ppl_cl.cli.main` can catch them without
importing the experiment registry (which imports every experiment module); the experiments
raise them through :mod:`ppl_cl.experiments.base`, which re-exports them.
"""

from __future__ import annotations

__all__ = ["ConfigError", "DeviceError", "Terminated", "NotFittedError"]


class ConfigError(ValueError):
    """Bad experiment name, unknown config key or unparsable ``--set`` value."""


class Terminated(BaseException):
    """The process was asked to stop by a signal (``ppl-cl`` raises it on SIGTERM: ``kill``, a
    batch system's time limit). A ``BaseException`` like ``KeyboardInterrupt``, so that no
    ``except Exception`` on the way swallows it; the message is the signal's name."""


class DeviceError(RuntimeError):
    """``--device`` names a device this machine does not have."""


class NotFittedError(RuntimeError):
    """``predict`` (or an export of the posterior) was called on a learner that has not seen
    any data yet: every learner raises this before its first ``update``."""
