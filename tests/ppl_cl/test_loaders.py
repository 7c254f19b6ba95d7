"""Real-data loaders and transforms (``ppl_cl.data.loaders``, ``ppl_cl.data.transforms``).

Two kinds of tests:

* fixture files written here in the exact on-disk format of each dataset (IDX gz, Gal / Evans
  UCI layouts, raw CSVs, MATLAB v5 cells, CIFAR pickles, xlsa17 .mat files) into the empty data
  root ``tmp_data_root``; the parsed values are checked entry by entry. Those files sit at paths
  whose real checksum is recorded, so they mismatch on purpose: the fixture tests ignore
  :class:`ChecksumWarning` (``_FIXTURE``), and ``test_checksum_mismatch_warns_once`` checks it;
* real files of ``../shared/data`` (``@pytest.mark.data``; skipped when absent), checked against
  the published sizes. Warnings are errors there, so the real files also pass their checksums.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.io

from ppl_cl.data import loaders as L
from ppl_cl.data.root import MissingDataError
from ppl_cl.data.transforms import Standardizer, standardize_split

_FIXTURE = pytest.mark.filterwarnings("ignore::ppl_cl.data.loaders.ChecksumWarning")


def _write(root: Path, relpath: str, content: bytes | str) -> Path:
    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


# ---------------------------------------------------------------------------------------------
# MNIST (IDX, gzip)
# ---------------------------------------------------------------------------------------------

def _idx(magic: int, array: np.ndarray) -> bytes:
    """IDX bytes: big-endian magic, one big-endian uint32 per dim, then the data."""
    return struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def _write_mnist(root: Path, rng, n_train=3, n_test=2, images_magic=2051, labels_magic=2049,
                 train_labels=None):
    out = {}
    for split, n, prefix in (("train", n_train, "train"), ("test", n_test, "t10k")):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        if split == "train" and train_labels is not None:
            labels = train_labels
        _write(root, f"mnist/{prefix}-images-idx3-ubyte.gz",
               gzip.compress(_idx(images_magic, images)))
        _write(root, f"mnist/{prefix}-labels-idx1-ubyte.gz",
               gzip.compress(_idx(labels_magic, labels)))
        out[split] = (images, labels)
    return out


@_FIXTURE
def test_mnist_idx_fixture(tmp_data_root):
    written = _write_mnist(tmp_data_root, np.random.default_rng(1))
    for split in ("train", "test"):
        images, labels = written[split]
        x, y = L.load_mnist(split)
        assert x.shape == (len(labels), 784) and x.dtype == np.float32
        assert y.dtype == np.int64
        np.testing.assert_array_equal(y, labels.astype(np.int64))
        # pixel (r, c) of image i is column 28 r + c, scaled by 1/255
        assert x[0, 28 * 5 + 7] == np.float32(images[0, 5, 7]) / np.float32(255)
        expected = images.reshape(-1, 784).astype(np.float32) / np.float32(255)
        np.testing.assert_array_equal(x, expected)
        assert 0.0 <= x.min() and x.max() <= 1.0


@_FIXTURE
def test_mnist_wrong_magic_and_sizes_raise(tmp_data_root):
    rng = np.random.default_rng(2)
    _write_mnist(tmp_data_root, rng, labels_magic=2051)
    with pytest.raises(ValueError, match="magic number 2051, expected 2049"):
        L.load_mnist("train")
    _write_mnist(tmp_data_root, rng, train_labels=np.zeros(4, dtype=np.uint8))  # 4 labels, 3 images
    with pytest.raises(ValueError, match="4 labels for 3 images"):
        L.load_mnist("train")
    images = np.zeros((2, 28, 28), dtype=np.uint8)
    _write(tmp_data_root, "mnist/t10k-images-idx3-ubyte.gz", gzip.compress(_idx(2051, images)[:-5]))
    with pytest.raises(ValueError, match=r"dims \(2, 28, 28\)"):
        L.load_mnist("test")
    with pytest.raises(ValueError, match="split must be"):
        L.load_mnist("valid")


def test_read_idx_types_and_header(tmp_path):
    values = (np.arange(6, dtype=np.float32).reshape(2, 3) / 4).astype(">f4")  # big-endian
    header = b"\x00\x00\x0d\x02" + struct.pack(">2I", 2, 3)  # type 0x0D = float32, 2 dims
    path = _write(tmp_path, "f.idx", header + values.tobytes())
    out = L.read_idx(path)
    assert out.dtype == np.float32 and out.dtype.byteorder in ("=", "|")
    np.testing.assert_array_equal(out, np.arange(6, dtype=np.float32).reshape(2, 3) / 4)
    _write(tmp_path, "bad.idx", b"\x01\x00\x08\x01" + struct.pack(">I", 1) + b"\x00")
    with pytest.raises(ValueError, match="not an IDX file"):
        L.read_idx(tmp_path / "bad.idx")


def test_digits():
    x, y = L.load_digits()
    assert x.shape == (1797, 64) and x.dtype == np.float64 and y.dtype == np.int64
    assert x.min() == 0.0 and x.max() == 1.0
    np.testing.assert_array_equal(x * 16, np.round(x * 16))  # counts 0..16 divided by 16
    np.testing.assert_array_equal(np.unique(y), np.arange(10))


# ---------------------------------------------------------------------------------------------
# UCI: Gal & Ghahramani layout, Evans layout, raw CSVs
# ---------------------------------------------------------------------------------------------

_GAL_TABLE = np.array([[540.0, 0.0, 79.99], [332.5, 142.5, 40.27], [198.6, 132.4, 44.30],
                       [266.0, 114.0, 47.03], [380.0, 95.0, 43.70]])


def _write_gal(root: Path, n_splits: int | None = 2):
    base = "uci/gal/concrete"
    # the real files: tab + space separated, trailing whitespace, a trailing blank line
    text = "".join(" \t".join(f"{v}" for v in row) + " \n" for row in _GAL_TABLE) + "\n"
    _write(root, f"{base}/data.txt", text)
    _write(root, f"{base}/index_features.txt", "0\n1\n")
    _write(root, f"{base}/index_target.txt", "2\n")
    _write(root, f"{base}/splits/index_train_0.txt", "4\n0\n2\n")
    _write(root, f"{base}/splits/index_test_0.txt", "1\n3\n")
    _write(root, f"{base}/splits/index_train_1.txt", "1\n2\n3\n")
    _write(root, f"{base}/splits/index_test_1.txt", "0\n4\n")
    if n_splits is not None:
        _write(root, f"{base}/n_splits.txt", f"{n_splits}\n")


@_FIXTURE
def test_uci_gal_fixture(tmp_data_root):
    _write_gal(tmp_data_root)
    split = L.load_uci_gal("concrete", split=0)
    assert isinstance(split, L.UCISplit)
    np.testing.assert_array_equal(split.x_train, _GAL_TABLE[[4, 0, 2], :2])
    np.testing.assert_array_equal(split.y_train, [43.70, 79.99, 44.30])
    np.testing.assert_array_equal(split.x_test, _GAL_TABLE[[1, 3], :2])
    np.testing.assert_array_equal(split.y_test, [40.27, 47.03])
    assert all(a.dtype == np.float64 for a in split)
    np.testing.assert_array_equal(L.load_uci_gal("concrete", split=1).y_test, [79.99, 43.70])


@_FIXTURE
def test_uci_gal_errors(tmp_data_root):
    _write_gal(tmp_data_root)
    with pytest.raises(ValueError, match=r"split 2 out of range: concrete has 2 splits \(0..1\)"):
        L.load_uci_gal("concrete", split=2)
    with pytest.raises(ValueError, match="split must be >= 0"):
        L.load_uci_gal("concrete", split=-1)
    with pytest.raises(ValueError, match="unknown Gal"):
        L.load_uci_gal("protein")
    _write_gal(tmp_data_root, n_splits=None)
    (tmp_data_root / "uci/gal/concrete/n_splits.txt").unlink()
    with pytest.raises(MissingDataError, match="uci/gal/concrete/splits/index_train_5.txt"):
        L.load_uci_gal("concrete", split=5)
    _write(tmp_data_root, "uci/gal/concrete/splits/index_test_0.txt", "1\n4\n")  # 4 also in train
    with pytest.raises(ValueError, match="both train and test"):
        L.load_uci_gal("concrete", split=0)
    _write(tmp_data_root, "uci/gal/concrete/splits/index_test_0.txt", "1\n5\n")  # row 5 absent
    with pytest.raises(ValueError, match=r"row indices must lie in 0..4"):
        L.load_uci_gal("concrete", split=0)


@_FIXTURE
def test_uci_evans_fixture(tmp_data_root):
    table = np.array([[0.5, -1.0, 0.25], [1.5, 2.0, -0.75], [-2.0, 0.0, 1.0], [0.0, 3.5, 0.5]])
    mask = np.array([[0, 1], [1, 0], [0, 0], [0, 1]])  # columns are splits, 1 = test row
    base = "uci/evans/elevators"
    _write(tmp_data_root, f"{base}/data.csv.gz",
           gzip.compress("".join(",".join(f"{v:g}" for v in r) + "\n" for r in table).encode()))
    _write(tmp_data_root, f"{base}/test_mask.csv.gz",
           gzip.compress("".join(",".join(str(v) for v in r) + "\n" for r in mask).encode()))
    split = L.load_uci_evans("elevators", split=0)
    np.testing.assert_array_equal(split.x_train, table[[0, 2, 3], :2])
    np.testing.assert_array_equal(split.y_train, table[[0, 2, 3], 2])
    np.testing.assert_array_equal(split.x_test, table[[1], :2])
    np.testing.assert_array_equal(split.y_test, [-0.75])
    split = L.load_uci_evans("elevators", split=1)
    np.testing.assert_array_equal(split.y_test, [0.25, 0.5])
    with pytest.raises(ValueError, match=r"split 2 out of range: elevators has 2 splits"):
        L.load_uci_evans("elevators", split=2)
    with pytest.raises(ValueError, match="unknown uci_datasets"):
        L.load_uci_evans("protein")


_BIKE_HEADER = ("instant,dteday,season,yr,mnth,hr,holiday,weekday,workingday,weathersit,temp,"
                "atemp,hum,windspeed,casual,registered,cnt")


@_FIXTURE
def test_bike_raw_fixture(tmp_data_root):
    # CRLF line ends, a blank line, a field with a trailing space: as in the real hour.csv
    lines = [_BIKE_HEADER,
             "1,2011-01-01,1,0,1,0,0,6,0,1,0.24,0.2879,0.81,0,3,13,16",
             "",
             "2,2011-01-01,1,0,1,1,0 ,6,0,1,0.22,0.2727,0.8,0.1343,8,32,40"]
    _write(tmp_data_root, "uci/raw/bike_sharing/hour.csv", "\r\n".join(lines) + "\r\n")
    x, y, names = L.load_bike_raw()
    assert names == ["season", "yr", "mnth", "hr", "holiday", "weekday", "workingday",
                     "weathersit", "temp", "atemp", "hum", "windspeed"]
    assert x.shape == (2, 12) and x.dtype == np.float64
    np.testing.assert_array_equal(y, [16.0, 40.0])
    np.testing.assert_array_equal(x[1], [1, 0, 1, 1, 0, 6, 0, 1, 0.22, 0.2727, 0.8, 0.1343])


_SKILL_HEADER = ("GameID,LeagueIndex,Age,HoursPerWeek,TotalHours,APM,SelectByHotkeys,"
                 "AssignToHotkeys,UniqueHotkeys,MinimapAttacks,MinimapRightClicks,NumberOfPACs,"
                 "GapBetweenPACs,ActionLatency,ActionsInPAC,TotalMapExplored,WorkersMade,"
                 "UniqueUnitsMade,ComplexUnitsMade,ComplexAbilitiesUsed")


@_FIXTURE
def test_skillcraft_raw_fixture(tmp_data_root):
    rows = ["52,5,27,10,3000,143.718,0.0035151591,0.0002196974,7,0.0001098487,0.0003923169,"
            "0.0048490365,32.6677,40.8673,4.7508,28,0.0013966,6,0,0",
            '10001,8,"?","?","?",400.0,0.01,0.001,5,0.001,0.001,0.005,30,35,5,30,0.002,8,1,0.001',
            "55,5,23,10,5000,129.2322,0.0033038124,0.0002594617,4,0.0002940566,0.0004324362,"
            "0.0043070643,32.9194,42.3454,4.8434,22,0.0011935,5,0,0.00020757"]
    _write(tmp_data_root, "uci/raw/skillcraft/SkillCraft1_Dataset_complete3338.csv",
           "\n".join([_SKILL_HEADER] + rows) + "\n")
    x, y, names = L.load_skillcraft_raw()  # drops the row with "?"
    assert names == _SKILL_HEADER.split(",")[2:]
    assert x.shape == (2, 18)
    np.testing.assert_array_equal(y, [5.0, 5.0])
    np.testing.assert_array_equal(x[:, :3], [[27, 10, 3000], [23, 10, 5000]])
    assert x[1, -1] == 0.00020757
    with pytest.raises(ValueError, match=r"line 3: missing value \('\?'\); 1 incomplete rows"):
        L.load_skillcraft_raw(on_missing="raise")


# ---------------------------------------------------------------------------------------------
# letter, schools, Parkinson's, magnetic
# ---------------------------------------------------------------------------------------------

_LETTER_ROWS = ["T,2,8,3,5,1,8,13,0,6,6,10,8,0,8,0,8", "A,5,12,3,7,2,10,5,5,4,13,3,9,2,8,4,10",
                "Z,4,11,6,8,6,10,6,2,6,10,3,7,3,7,3,9"]


@_FIXTURE
@pytest.mark.parametrize("header", [True, False])
def test_letter_fixture(tmp_data_root, header):
    lines = (["Letter," + ",".join(str(i) for i in range(1, 17))] if header else []) + _LETTER_ROWS
    _write(tmp_data_root, "letter/letter-recognition.data", "\n".join(lines))
    x, y = L.load_letter()
    assert x.shape == (3, 16) and x.dtype == np.float64 and y.dtype == np.int64
    np.testing.assert_array_equal(y, [19, 0, 25])  # T, A, Z -> 0-based alphabet index
    np.testing.assert_array_equal(x[1], [5, 12, 3, 7, 2, 10, 5, 5, 4, 13, 3, 9, 2, 8, 4, 10])


@_FIXTURE
def test_letter_bad_row(tmp_data_root):
    _write(tmp_data_root, "letter/letter-recognition.data", "\n".join(_LETTER_ROWS + ["B,1,2"]))
    with pytest.raises(ValueError, match="line 4: expected a capital letter and 16 integers"):
        L.load_letter()


def _write_schools(root: Path, rng, sizes=(3, 5, 2), bias=1):
    xs, ys = np.empty((1, len(sizes)), dtype=object), np.empty((1, len(sizes)), dtype=object)
    for t, n in enumerate(sizes):
        x = rng.integers(0, 2, size=(n, 28)).astype(np.uint8)
        x[:, 3] = rng.integers(8, 40, size=n)  # % free school meals
        x[:, 27] = bias
        xs[0, t], ys[0, t] = x, rng.integers(1, 70, size=(n, 1)).astype(np.uint8)
    path = root / "schools/school.mat"
    path.parent.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(path, {"X": xs, "Y": ys})  # cells, as in MALSAR's school.mat
    return xs, ys


@_FIXTURE
def test_schools_fixture(tmp_data_root):
    xs, ys = _write_schools(tmp_data_root, np.random.default_rng(3))
    tasks = L.load_schools()
    assert len(tasks) == 3
    for (x, y), x_cell, y_cell in zip(tasks, xs[0], ys[0]):
        assert x.shape == (x_cell.shape[0], 27) and x.dtype == np.float64 and y.shape == (len(x),)
        np.testing.assert_array_equal(x, x_cell[:, :27])
        np.testing.assert_array_equal(y, y_cell[:, 0])
    full = L.load_schools(drop_bias=False)
    assert full[1][0].shape == (5, 28) and np.all(full[1][0][:, 27] == 1)
    _write_schools(tmp_data_root, np.random.default_rng(3), bias=2)
    with pytest.raises(ValueError, match="not all ones"):
        L.load_schools()


_PARKINSONS_HEADER = ("subject#,age,sex,test_time,motor_UPDRS,total_UPDRS,Jitter(%),Jitter(Abs),"
                      "Jitter:RAP,Jitter:PPQ5,Jitter:DDP,Shimmer,Shimmer(dB),Shimmer:APQ3,"
                      "Shimmer:APQ5,Shimmer:APQ11,Shimmer:DDA,NHR,HNR,RPDE,DFA,PPE")


@_FIXTURE
def test_parkinsons_fixture(tmp_data_root):
    rng = np.random.default_rng(4)
    subjects = [2, 1, 2, 1, 1]
    rows = np.column_stack([subjects, rng.integers(50, 80, 5), rng.integers(0, 2, 5),
                            rng.uniform(0, 200, 5), rng.uniform(5, 40, (5, 2)),
                            rng.uniform(0, 1, (5, 16))])
    rows[:, 5] += rows[:, 4]  # total UPDRS >= motor UPDRS
    text = _PARKINSONS_HEADER + "\n" + "\n".join(",".join(repr(float(v)) for v in r) for r in rows)
    _write(tmp_data_root, "parkinsons/parkinsons_updrs.data", text)
    motor, total = L.load_parkinsons("motor"), L.load_parkinsons("total")
    assert len(motor) == 2  # subjects 1 and 2, in that order, rows in file order
    np.testing.assert_array_equal(motor[0][0], rows[[1, 3, 4], 6:])
    np.testing.assert_array_equal(motor[0][1], rows[[1, 3, 4], 4])
    np.testing.assert_array_equal(motor[1][0], rows[[0, 2], 6:])
    np.testing.assert_array_equal(total[1][1], rows[[0, 2], 5])
    assert motor[1][0].shape == (2, 16)
    with pytest.raises(ValueError, match="target must be"):
        L.load_parkinsons("updrs")


def _write_magnetic(root: Path, lengths=None):
    lengths = lengths or {run: 3 + run for run in range(1, 10)}
    for run in range(1, 10):
        n = lengths[run]
        time = 19.7 + 0.02 * np.arange(n)
        loc = np.column_stack([np.linspace(0.26, 0.1, n), np.linspace(-0.29, 0.3, n)]) + run
        mag = np.column_stack([np.full(n, 3.0), np.full(n, 4.0 * run), np.arange(n) - 12.0])
        for kind, values in (("time", time[:, None]), ("loc", loc), ("mag", mag)):
            text = "\n".join(",".join(f"{v:.5f}" for v in row) for row in values) + "\n"
            _write(root, f"magnetic/invensense/{run}-{kind}.csv", text)


@_FIXTURE
def test_magnetic_fixture(tmp_data_root):
    _write_magnetic(tmp_data_root)
    run = L.load_magnetic(3)
    assert run.time.shape == (6,) and run.loc.shape == (6, 2) and run.mag.shape == (6, 3)
    assert run.time[1] == 19.72 and run.loc[0, 0] == 3.26
    np.testing.assert_array_equal(run.mag[2], [3.0, 12.0, -10.0])
    expected_norm = np.sqrt(9.0 + 144.0 + (np.arange(6) - 12.0) ** 2)
    np.testing.assert_allclose(run.norm, expected_norm, rtol=1e-15)
    runs = L.load_magnetic_runs([5, 2])
    assert [len(r.time) for r in runs] == [8, 5]
    with pytest.raises(ValueError, match="run must be an int in 1..9"):
        L.load_magnetic(0)
    _write(tmp_data_root, "magnetic/invensense/4-loc.csv", "0.1,0.2\n")
    with pytest.raises(ValueError, match="time, loc and mag have 7, 1 and 7 rows"):
        L.load_magnetic(4)


# ---------------------------------------------------------------------------------------------
# CIFAR pickles
# ---------------------------------------------------------------------------------------------

def _cifar_rows(images: np.ndarray) -> np.ndarray:
    """(n, 32, 32, 3) -> the file layout (n, 3072): R plane, G plane, B plane, each row-major."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(len(images), 3072))


def _py2_pickle(obj) -> bytes:
    """Protocol-2 bytes as Python 2 cPickle with NumPy 1.x wrote the CIFAR files.

    Python 2 ``str`` (keys, array data) is a BINSTRING / SHORT_BINSTRING; arrays are rebuilt by
    ``numpy.core.multiarray._reconstruct(numpy.ndarray, (0,), 'b')`` + ``__setstate__((1,
    shape, dtype, is_fortran, raw bytes))``; dtypes by ``numpy.dtype('u1', 0, 1)`` +
    ``__setstate__((3, '|', None, None, None, -1, -1, 0))``.
    """
    out = bytearray(b"\x80\x02")

    def string(b: bytes):
        short = len(b) < 256
        out.extend((b"U" + bytes([len(b)]) if short else b"T" + struct.pack("<I", len(b))) + b)

    def integer(i: int):
        out.extend(b"K" + bytes([i]) if 0 <= i < 256 else b"J" + struct.pack("<i", i))

    def emit(o):
        if isinstance(o, dict):
            out.extend(b"}(")
            for k, v in o.items():
                emit(k)
                emit(v)
            out.extend(b"u")
        elif isinstance(o, list):
            out.extend(b"](")
            for v in o:
                emit(v)
            out.extend(b"e")
        elif isinstance(o, bytes):
            string(o)
        elif isinstance(o, int):
            integer(o)
        elif isinstance(o, np.ndarray):
            out.extend(b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n")
            integer(0)
            out.extend(b"\x85")
            string(b"b")
            out.extend(b"\x87R(")
            integer(1)
            out.extend(b"(")
            for s in o.shape:
                integer(s)
            out.extend(b"tcnumpy\ndtype\n")
            string(o.dtype.str[1:].encode())
            integer(0)
            integer(1)
            out.extend(b"\x87R(")
            integer(3)
            string(b"|")
            out.extend(b"NNN")
            integer(-1)
            integer(-1)
            integer(0)
            out.extend(b"tb\x89")
            string(o.tobytes())
            out.extend(b"tb")
        else:
            raise TypeError(type(o))

    emit(obj)
    out.extend(b".")
    return bytes(out)


def _dump(obj, protocol) -> bytes:
    return _py2_pickle(obj) if protocol == "py2" else pickle.dumps(obj, protocol=protocol)


_CIFAR10_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog",
                  b"horse", b"ship", b"truck"]


def _write_cifar10(root: Path, rng, protocol=pickle.DEFAULT_PROTOCOL, n_per_batch=2):
    base, written = "cifar-10-batches-py", {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        images = rng.integers(0, 256, size=(n_per_batch, 32, 32, 3), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n_per_batch)]
        batch = {b"batch_label": f"{name} of 5".encode(), b"labels": labels,
                 b"data": _cifar_rows(images),
                 b"filenames": [f"img_{i}.png".encode() for i in range(n_per_batch)]}
        _write(root, f"{base}/{name}", _dump(batch, protocol))
        written[name] = (images, labels)
    meta = {b"num_cases_per_batch": n_per_batch, b"label_names": _CIFAR10_NAMES, b"num_vis": 3072}
    _write(root, f"{base}/batches.meta", _dump(meta, protocol))
    return written


@_FIXTURE
@pytest.mark.parametrize("protocol", ["py2", 2, 4, 5])
def test_cifar10_fixture(tmp_data_root, protocol):
    written = _write_cifar10(tmp_data_root, np.random.default_rng(5), protocol)
    x, y = L.load_cifar10("train")
    assert x.shape == (10, 32, 32, 3) and x.dtype == np.uint8 and y.dtype == np.int64
    order = [f"data_batch_{i}" for i in range(1, 6)]  # batches 1..5, in order
    np.testing.assert_array_equal(x, np.concatenate([written[n][0] for n in order]))
    np.testing.assert_array_equal(y, np.concatenate([written[n][1] for n in order]))
    x_test, y_test = L.load_cifar10("test")
    np.testing.assert_array_equal(x_test, written["test_batch"][0])
    np.testing.assert_array_equal(y_test, written["test_batch"][1])
    assert L.cifar_class_names("cifar10")[:3] == ["airplane", "automobile", "bird"]


@_FIXTURE
def test_cifar_channel_order(tmp_data_root):
    """Entry 1024 c + 32 r + w of a row is channel c (R, G, B) of pixel (row r, column w)."""
    _write_cifar10(tmp_data_root, np.random.default_rng(6))
    data = np.zeros((1, 3072), dtype=np.uint8)
    data[0, 0 * 1024 + 5 * 32 + 7] = 11   # red, row 5, column 7
    data[0, 1 * 1024 + 0 * 32 + 31] = 22  # green, row 0, column 31
    data[0, 2 * 1024 + 31 * 32 + 0] = 33  # blue, row 31, column 0
    batch = {b"batch_label": b"testing batch 1 of 1", b"labels": [3], b"data": data,
             b"filenames": [b"x.png"]}
    _write(tmp_data_root, "cifar-10-batches-py/test_batch", _py2_pickle(batch))
    x, y = L.load_cifar10("test")
    assert x.shape == (1, 32, 32, 3) and y.tolist() == [3]
    assert (x[0, 5, 7, 0], x[0, 0, 31, 1], x[0, 31, 0, 2]) == (11, 22, 33)
    assert int(x.sum()) == 66


@_FIXTURE
def test_cifar100_fixture(tmp_data_root):
    rng = np.random.default_rng(7)
    written = {}
    for split, n in (("train", 4), ("test", 3)):
        images = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, size=n)]
        coarse = [int(v) for v in rng.integers(0, 20, size=n)]
        batch = {b"filenames": [b"f.png"] * n, b"batch_label": b"training batch 1 of 1",
                 b"fine_labels": fine, b"coarse_labels": coarse, b"data": _cifar_rows(images)}
        _write(tmp_data_root, f"cifar-100-python/{split}", _py2_pickle(batch))
        written[split] = (images, fine, coarse)
    meta = {b"fine_label_names": [b"apple", b"aquarium_fish"] + [b"c%d" % i for i in range(98)],
            b"coarse_label_names": [b"aquatic_mammals"] + [b"s%d" % i for i in range(19)]}
    _write(tmp_data_root, "cifar-100-python/meta", _py2_pickle(meta))
    for split in ("train", "test"):
        images, fine, coarse = written[split]
        x, y = L.load_cifar100(split)
        np.testing.assert_array_equal(x, images)
        np.testing.assert_array_equal(y, fine)
        np.testing.assert_array_equal(L.load_cifar100(split, label="coarse")[1], coarse)
    assert L.cifar_class_names("cifar100")[:2] == ["apple", "aquarium_fish"]
    assert L.cifar_class_names("cifar100", label="coarse")[0] == "aquatic_mammals"
    with pytest.raises(ValueError, match="label must be"):
        L.load_cifar100("train", label="medium")


class _Exploit:
    def __init__(self, func, arg):
        self.func, self.arg = func, arg

    def __reduce__(self):
        return self.func, (self.arg,)


@_FIXTURE
@pytest.mark.parametrize("func", ["system", "eval"])
def test_malicious_cifar_pickle_refused(tmp_data_root, func):
    _write_cifar10(tmp_data_root, np.random.default_rng(8))
    marker = tmp_data_root / "pwned"
    payload = (_Exploit(os.system, f"touch {marker}") if func == "system"
               else _Exploit(eval, f"open({str(marker)!r}, 'w')"))
    batch = {b"data": payload, b"labels": [0]}
    _write(tmp_data_root, "cifar-10-batches-py/test_batch", pickle.dumps(batch))
    with pytest.raises(pickle.UnpicklingError, match="refusing to load global"):
        L.load_cifar10("test")
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# CUB features (xlsa17 .mat files)
# ---------------------------------------------------------------------------------------------

def test_cub_features_fixture(tmp_data_root):
    rng = np.random.default_rng(9)
    n = 6
    features = rng.normal(size=(2048, n))  # xlsa17 stores (D, N)
    labels = np.array([[1], [3], [2], [3], [1], [2]])  # 1-based
    names = np.empty((3, 1), dtype=object)
    names[:, 0] = ["001.Black_footed_Albatross", "002.Laysan_Albatross", "003.Sooty_Albatross"]
    files = np.empty((n, 1), dtype=object)
    files[:, 0] = [f"/BS/Deep_Fragments/CUB/images/{i}.jpg" for i in range(n)]
    (tmp_data_root / "cub").mkdir()
    scipy.io.savemat(tmp_data_root / "cub/res101.mat",
                     {"features": features, "labels": labels, "image_files": files})
    loc = {"trainval_loc": [1, 2, 4], "test_seen_loc": [5], "test_unseen_loc": [3, 6],
           "train_loc": [1, 4], "val_loc": [2]}
    scipy.io.savemat(tmp_data_root / "cub/att_splits.mat",
                     {"allclasses_names": names, "att": rng.uniform(size=(312, 3)),
                      **{k: np.array(v, dtype=np.uint16)[:, None] for k, v in loc.items()}})
    cub = L.load_cub_features()
    assert cub.features.shape == (n, 2048) and cub.features.dtype == np.float32
    np.testing.assert_array_equal(cub.features, features.T.astype(np.float32))
    assert cub.labels.dtype == np.int64
    np.testing.assert_array_equal(cub.labels, [0, 2, 1, 2, 0, 1])
    np.testing.assert_array_equal(cub.trainval_idx, [0, 1, 3])
    np.testing.assert_array_equal(cub.test_seen_idx, [4])
    np.testing.assert_array_equal(cub.test_unseen_idx, [2, 5])
    np.testing.assert_array_equal(cub.train_idx, [0, 3])
    np.testing.assert_array_equal(cub.val_idx, [1])
    assert cub.class_names == list(names[:, 0])
    assert cub.class_names[cub.labels[1]] == "003.Sooty_Albatross"


# ---------------------------------------------------------------------------------------------
# missing files, explicit data_dir, checksums
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("load, relpath", [
    (lambda: L.load_mnist("test"), "mnist/train-images-idx3-ubyte.gz"),
    (lambda: L.load_uci_gal("kin8nm"), "uci/gal/kin8nm/data.txt"),
    (lambda: L.load_uci_evans("bike"), "uci/evans/bike/data.csv.gz"),
    (L.load_bike_raw, "uci/raw/bike_sharing/hour.csv"),
    (L.load_skillcraft_raw, "uci/raw/skillcraft/SkillCraft1_Dataset_complete3338.csv"),
    (L.load_letter, "letter/letter-recognition.data"),
    (L.load_schools, "schools/school.mat"),
    (L.load_parkinsons, "parkinsons/parkinsons_updrs.data"),
    (lambda: L.load_magnetic(2), "magnetic/invensense/1-time.csv"),
    (lambda: L.load_cifar10("train"), "cifar-10-batches-py/data_batch_1"),
    (lambda: L.load_cifar100("test"), "cifar-100-python/train"),
    (L.load_cub_features, "cub/res101.mat"),
])
def test_missing_file_error_names_file_and_roots(tmp_data_root, load, relpath):
    with pytest.raises(MissingDataError) as info:
        load()
    message = str(info.value)
    assert relpath in message
    assert str(tmp_data_root) in message and str(tmp_data_root / "cache" / "ppl_cl") in message
    assert "Get it from" in message


@_FIXTURE
def test_explicit_data_dir_is_searched_first(tmp_data_root, tmp_path_factory):
    other = tmp_path_factory.mktemp("other_root")
    _write(tmp_data_root, "letter/letter-recognition.data", _LETTER_ROWS[0])
    _write(other, "letter/letter-recognition.data", "\n".join(_LETTER_ROWS))
    assert len(L.load_letter()[1]) == 1  # PPL_CL_DATA root
    assert len(L.load_letter(data_dir=other)[1]) == 3


def test_checksum_mismatch_warns_once(tmp_data_root):
    path = _write(tmp_data_root, "letter/letter-recognition.data", "\n".join(_LETTER_ROWS))
    with pytest.warns(L.ChecksumWarning, match="letter/letter-recognition.data"):
        L.load_letter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(L.load_letter()[1]) == 3  # same file: verified once per process
    path.write_text("\n".join(_LETTER_ROWS[:2]))
    with pytest.warns(L.ChecksumWarning, match="does not match its published checksum"):
        assert len(L.load_letter()[1]) == 2  # changed file: verified again, still loaded


def test_file_without_checksum_does_not_warn(tmp_data_root):
    # only data.txt of the Gal layout has a recorded checksum; the others are "unknown"
    _write_gal(tmp_data_root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        L.load_uci_gal("concrete")
    assert [str(w.message).split(" ")[0] for w in caught] == ["uci/gal/concrete/data.txt"]


# ---------------------------------------------------------------------------------------------
# transforms
# ---------------------------------------------------------------------------------------------

def test_standardizer_round_trip_and_constant_columns():
    rng = np.random.default_rng(10)
    x = np.column_stack([rng.normal(3.0, 2.0, 50), np.full(50, 0.998), rng.uniform(0, 1e4, 50)])
    standardizer = Standardizer().fit(x)
    z = standardizer.transform(x)
    np.testing.assert_allclose(z[:, [0, 2]].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(z[:, [0, 2]].std(axis=0), 1.0, rtol=1e-12)
    assert standardizer.scale[1] == 1.0 and np.all(z[:, 1] == 0.0)  # constant column: centred only
    np.testing.assert_allclose(standardizer.inverse_transform(z), x, rtol=1e-14)
    assert np.all(standardizer.inverse_transform(z)[:, 1] == 0.998)
    np.testing.assert_allclose(standardizer.mean[[0, 2]], x[:, [0, 2]].mean(axis=0), rtol=1e-15)
    assert standardizer.mean[1] == 0.998
    np.testing.assert_allclose(standardizer.scale[[0, 2]], x[:, [0, 2]].std(axis=0), rtol=1e-15)
    # batched inputs (..., d)
    np.testing.assert_allclose(standardizer.transform(x.reshape(5, 10, 3)), z.reshape(5, 10, 3))


def test_standardizer_targets_and_variance():
    rng = np.random.default_rng(11)
    y = rng.normal(-4.0, 3.0, 200).astype(np.float32)
    standardizer = Standardizer().fit(y)
    assert standardizer.mean.shape == () and standardizer.transform(y).dtype == np.float64
    z = standardizer.transform(y)
    # Var[y] = scale^2 Var[z]
    np.testing.assert_allclose(standardizer.inverse_transform_variance(z.var()),
                               y.astype(np.float64).var(), rtol=1e-12)
    restored = Standardizer.from_state_dict(standardizer.state_dict())
    np.testing.assert_array_equal(restored.transform(y), z)


def test_standardizer_errors():
    with pytest.raises(RuntimeError, match="not fitted"):
        Standardizer().transform(np.zeros((2, 3)))
    standardizer = Standardizer().fit(np.arange(6.0).reshape(3, 2))
    with pytest.raises(ValueError, match="trailing dimension 2"):
        standardizer.transform(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="non-finite"):
        Standardizer().fit(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="0 rows"):
        Standardizer().fit(np.zeros((0, 2)))
    with pytest.raises(ValueError, match="non-negative"):
        Standardizer().fit(np.arange(3.0)).inverse_transform_variance(np.array([-1.0]))


def test_standardize_split_uses_train_statistics():
    rng = np.random.default_rng(12)
    split = L.UCISplit(rng.normal(5, 2, (30, 3)), rng.normal(1, 4, 30),
                       rng.normal(0, 1, (10, 3)), rng.normal(0, 1, 10))
    standardized, x_std, y_std = standardize_split(split)
    mean, std = split.x_train.mean(axis=0), split.x_train.std(axis=0)
    np.testing.assert_allclose(standardized.x_test, (split.x_test - mean) / std, rtol=1e-13)
    y_mean, y_std_dev = split.y_train.mean(), split.y_train.std()
    np.testing.assert_allclose(standardized.y_test, (split.y_test - y_mean) / y_std_dev, rtol=1e-13)
    np.testing.assert_allclose(standardized.x_train.mean(axis=0), 0.0, atol=1e-13)
    np.testing.assert_allclose(y_std.inverse_transform(standardized.y_test), split.y_test,
                               rtol=1e-13)
    np.testing.assert_allclose(x_std.inverse_transform(standardized.x_train), split.x_train,
                               rtol=1e-13)


# ---------------------------------------------------------------------------------------------
# real files (../shared/data)
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mnist():
    return {split: L.load_mnist(split) for split in ("train", "test")}


@pytest.mark.data("mnist")
def test_real_mnist(mnist):
    (x, y), (x_test, y_test) = mnist["train"], mnist["test"]
    assert x.shape == (60000, 784) and x_test.shape == (10000, 784)
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert x.min() == 0.0 and x.max() == 1.0
    # published class counts of the training set and the first test labels
    np.testing.assert_array_equal(np.bincount(y), [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265,
                                                   5851, 5949])
    np.testing.assert_array_equal(y_test[:10], [7, 2, 1, 0, 4, 1, 4, 9, 5, 9])


@pytest.mark.data("uci-gal/concrete", "uci-gal/kin8nm", "uci-gal/naval-propulsion-plant")
def test_real_uci_gal():
    concrete = L.load_uci_gal("concrete", split=0)
    assert len(concrete.y_train) + len(concrete.y_test) == 1030 and concrete.x_train.shape[1] == 8
    assert L.load_uci_gal("concrete", split=19).x_test.shape[1] == 8
    with pytest.raises(ValueError, match="concrete has 20 splits"):
        L.load_uci_gal("concrete", split=20)
    kin8nm = L.load_uci_gal("kin8nm", split=3)
    assert len(kin8nm.y_train) + len(kin8nm.y_test) == 8192 and kin8nm.x_test.shape[1] == 8
    naval = L.load_uci_gal("naval-propulsion-plant")
    assert naval.x_train.shape[1] == 16 and len(naval.y_train) + len(naval.y_test) == 11934
    # target = column 16 (compressor decay coefficient, 0.95..1), not the last column
    assert naval.y_train.min() == 0.95 and naval.y_train.max() == 1.0


@pytest.mark.data("uci-evans/elevators")
def test_real_uci_evans():
    split = L.load_uci_evans("elevators", split=0)
    assert split.x_train.shape == (14940, 18) and split.x_test.shape == (1659, 18)
    assert len(split.y_train) + len(split.y_test) == 16599


@pytest.mark.data("schools")
def test_real_schools():
    tasks = L.load_schools()
    assert len(tasks) == 139 and sum(len(y) for _, y in tasks) == 15362
    assert all(x.shape[1] == 27 for x, _ in tasks)


@pytest.mark.data("parkinsons")
def test_real_parkinsons():
    motor, total = L.load_parkinsons("motor"), L.load_parkinsons("total")
    assert len(motor) == 42 and sum(len(y) for _, y in motor) == 5875
    assert all(x.shape[1] == 16 for x, _ in motor)
    assert all(np.all(t >= m) for (_, m), (_, t) in zip(motor, total))  # total includes motor


@pytest.mark.data("letter")
def test_real_letter():
    x, y = L.load_letter()
    assert x.shape == (20000, 16)
    np.testing.assert_array_equal(np.unique(y), np.arange(26))
    assert x.min() == 0 and x.max() == 15


@pytest.mark.data("magnetic")
def test_real_magnetic():
    runs = L.load_magnetic_runs()
    assert [len(r.time) for r in runs] == [8875, 9105, 9404, 7332, 8313, 7119, 8394, 8928, 8557]
    for r in runs:
        assert r.loc.shape == (len(r.time), 2) and r.mag.shape == (len(r.time), 3)
        assert np.all(np.diff(r.time) > 0)


@pytest.mark.data("bike-raw", "skillcraft-raw")
def test_real_raw_csvs():
    x, y, names = L.load_bike_raw()
    assert x.shape == (17379, 12) and len(names) == 12
    assert y.sum() == 3292679  # total rentals 2011-2012
    x, y, names = L.load_skillcraft_raw()
    assert x.shape == (3338, 18) and names[0] == "Age"
