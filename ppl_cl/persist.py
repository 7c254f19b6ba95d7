"""Checkpoint format: one ``.npz`` file, no pickle, atomic writes, a format version.

A learner's state is a nested tree of dicts / lists / tuples whose leaves are arrays (NumPy,
torch or JAX) or JSON scalars. :func:`save_tree` splits it into

* ``__meta__``: a JSON document holding the format version, free-form metadata (learner class,
  config) and the *skeleton* of the tree, each array replaced by
  ``{"__array__": key, "kind": "torch"|"jax"|"numpy", "dtype": ...}``;
* one NumPy array per leaf.

It writes to a temporary file in the same directory and ``os.replace``-s it into place, so an
interrupted save never leaves a truncated checkpoint. :func:`load_tree` restores leaves to the
library they came from (torch tensors onto ``device`` if given). Loading uses
``allow_pickle=False``: a checkpoint cannot execute code.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ppl_cl.batch import array_backend, as_numpy
from ppl_cl.errors import ConfigError

FORMAT_VERSION = 1
__all__ = ["FORMAT_VERSION", "save_tree", "load_tree", "atomic_write_bytes", "atomic_write_text",
           "make_folder", "read_meta", "CheckpointError"]


class CheckpointError(RuntimeError):
    """A checkpoint is unreadable, of another format version, or for another learner."""


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder + ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)     # as an ordinary file (mkstemp makes it private, 0600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def _flatten(node: Any, arrays: dict[str, np.ndarray], prefix: str) -> Any:
    if isinstance(node, dict):
        for k in node:
            if not isinstance(k, str):
                raise TypeError(f"state keys must be strings, received {k!r} at '{prefix}'")
        return {"__dict__": {k: _flatten(v, arrays, f"{prefix}/{k}") for k, v in node.items()}}
    if isinstance(node, (list, tuple)):
        tag = "__tuple__" if isinstance(node, tuple) else "__list__"
        return {tag: [_flatten(v, arrays, f"{prefix}/{i}") for i, v in enumerate(node)]}
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, (np.integer, np.floating, np.bool_)):
        return node.item()
    kind = array_backend(node)
    if kind == "numpy" and not isinstance(node, np.ndarray):
        raise TypeError(f"cannot store {type(node).__name__} at '{prefix}' in a checkpoint")
    arr = as_numpy(node)
    key = f"a{len(arrays)}"
    arrays[key] = np.array(arr, order="C")  # keeps 0-d arrays 0-d
    return {"__array__": key, "kind": kind, "dtype": str(arr.dtype)}


def _unflatten(node: Any, arrays: Any, device: Any) -> Any:
    if isinstance(node, dict):
        if "__dict__" in node:
            return {k: _unflatten(v, arrays, device) for k, v in node["__dict__"].items()}
        if "__list__" in node:
            return [_unflatten(v, arrays, device) for v in node["__list__"]]
        if "__tuple__" in node:
            return tuple(_unflatten(v, arrays, device) for v in node["__tuple__"])
        if "__array__" in node:
            arr = arrays[node["__array__"]]
            if node["kind"] == "torch":
                import torch

                t = torch.from_numpy(np.array(arr))
                return t.to(device) if device is not None else t
            if node["kind"] == "jax":
                import jax.numpy as jnp

                return jnp.asarray(arr)
            return np.array(arr)
        raise CheckpointError(f"unknown node in checkpoint skeleton: {sorted(node)}")
    return node


def save_tree(path: str | os.PathLike, tree: Any, meta: dict[str, Any] | None = None) -> None:
    """Save ``tree`` (and JSON ``meta``) to ``path`` atomically."""
    arrays: dict[str, np.ndarray] = {}
    skeleton = _flatten(tree, arrays, "")
    header = {"format_version": FORMAT_VERSION, "meta": meta or {}, "tree": skeleton}
    buf = io.BytesIO()
    np.savez(buf, __meta__=np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8),
             **arrays)
    atomic_write_bytes(path, buf.getvalue())


def read_meta(path: str | os.PathLike) -> dict[str, Any] | None:
    """The ``meta`` of a checkpoint written by :func:`save_tree`, without reading its arrays;
    ``None`` when the file is not a readable checkpoint (:func:`load_tree` says why)."""
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as npz:
            header = json.loads(npz["__meta__"].tobytes().decode("utf-8"))
    except (zipfile.BadZipFile, EOFError, zlib.error, ValueError, KeyError, OSError,
            UnicodeDecodeError):
        return None
    meta = header.get("meta") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else None


def load_tree(path: str | os.PathLike, device: Any = None) -> tuple[Any, dict[str, Any]]:
    """Load ``(tree, meta)`` saved by :func:`save_tree`.

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: naming ``path`` and what is wrong when the file is empty, truncated,
            corrupted, not a ``.npz`` archive, an archive not written by :func:`save_tree`, or of
            another format version.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.is_dir():
        raise CheckpointError(f"{path}: expected a checkpoint file, received a directory")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path}: the checkpoint is empty (0 bytes)")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"PK\x03\x04":
        raise CheckpointError(f"{path}: not a ppl_cl checkpoint (expected an .npz archive "
                              f"written by save(), received a file starting {magic!r})")
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as npz:
            if "__meta__" not in npz.files:
                raise CheckpointError(f"{path}: an .npz archive but not a ppl_cl checkpoint "
                                      "(no __meta__ entry)")
            header = json.loads(npz["__meta__"].tobytes().decode("utf-8"))
            arrays = {k: npz[k] for k in npz.files if k != "__meta__"}
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, EOFError, zlib.error, ValueError, KeyError, OSError,
            UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: the checkpoint is truncated or corrupted "
                              f"({type(exc).__name__}: {(str(exc).splitlines() or ['unreadable'])[0]}); "
                              "write it again") from exc
    if not isinstance(header, dict) or "tree" not in header:
        raise CheckpointError(f"{path}: not a ppl_cl checkpoint (its __meta__ has no tree)")
    version = header.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {version}, this ppl_cl reads "
                              f"version {FORMAT_VERSION}")
    try:
        return _unflatten(header["tree"], arrays, device), header.get("meta", {})
    except KeyError as exc:
        raise CheckpointError(f"{path}: the checkpoint is corrupted (array {exc} missing)") \
            from exc


def make_folder(path: str | Path, option: str = "--out") -> Path:
    """Create the folder ``path`` (and its parents) or raise a :class:`ConfigError` naming
    ``option``, the folder and why (a file in the way, no permission, a read-only file
    system, ...)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option}: expected a folder, received the file {path}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{option} {path}: cannot create the folder "
                          f"({err.strerror or type(err).__name__})") from None
    return path
