"""The official CUB-200 few-shot class-incremental sessions (Tao et al. 2020, "Few-shot
class-incremental learning", CVPR; the lists GP-Tree's code ships in FSCIL/cub/index_list/)
applied to pre-extracted features.

The lists name images, e.g. ``CUB_200_2011/images/101.White_Pelican/White_Pelican_0081_96148.jpg``:
``session_1.txt`` the base training images (100 classes, 30 each), ``session_<k>.txt`` the 50
training images of session k (10-way 5-shot), ``test_<k>.txt`` the test images of the classes
that session k introduces. The xlsa17 feature file ``cub/res101.mat`` names its rows in
``image_files`` (absolute paths of the original machine); rows are matched to list entries by
their last three path parts ``images/<class folder>/<file>``. Labels are the class folder's
number minus one (``101.White_Pelican`` -> 100), as in Tao et al.'s loader.

Place the lists under the data root as ``cub/index_list/session_<k>.txt`` and
``cub/index_list/test_<k>.txt`` (k = 1..11).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ppl_cl.batch import Batch
from ppl_cl.data.streams import TaskSplit

__all__ = ["image_key", "read_session_lists", "cub_session_lists_splits", "sessions_from_lists"]


def image_key(path: str) -> str:
    """``images/<class folder>/<file>`` of an image path (the part both sources share)."""
    parts = path.replace("\\", "/").strip().split("/")
    return "/".join(parts[-3:])


def _label(key: str) -> int:
    folder = key.split("/")[-2]
    try:
        return int(folder.split(".")[0]) - 1
    except ValueError:
        raise ValueError(f"{key}: class folder {folder!r} does not start with a class number") from None


def read_session_lists(index_dir: str | Path) -> tuple[list[list[str]], list[list[str]]]:
    """``(train_lists, test_lists)``: the image keys of ``session_<k>.txt`` / ``test_<k>.txt``
    for k = 1, 2, ... while both files exist."""
    index_dir = Path(index_dir)
    train, test = [], []
    k = 1
    while (index_dir / f"session_{k}.txt").exists():
        tf = index_dir / f"test_{k}.txt"
        if not tf.exists():
            raise FileNotFoundError(f"{tf} is missing (session_{k}.txt exists)")
        train.append([image_key(l) for l in (index_dir / f"session_{k}.txt").read_text().splitlines() if l.strip()])
        test.append([image_key(l) for l in tf.read_text().splitlines() if l.strip()])
        k += 1
    if not train:
        raise FileNotFoundError(f"no session_1.txt in {index_dir}: put the FSCIL lists of Tao et "
                                "al. 2020 (GP-Tree's FSCIL/cub/index_list/) there")
    return train, test


def sessions_from_lists(features: np.ndarray, image_files: list[str], train_lists, test_lists
                        ) -> list[TaskSplit]:
    """One :class:`TaskSplit` per session: train = the rows of ``session_<k>``, test = the rows
    of ``test_1 .. test_k`` (every class seen so far).

    Raises:
        ValueError: a listed image has no feature row, or a session lists no image.
    """
    row = {image_key(f): i for i, f in enumerate(image_files)}

    def rows(keys, what):
        missing = [k for k in keys if k not in row]
        if missing:
            raise ValueError(f"{what}: {len(missing)} listed images have no feature row, e.g. "
                             f"{missing[0]!r}")
        return np.asarray([row[k] for k in keys], dtype=np.int64), \
            np.asarray([_label(k) for k in keys], dtype=np.int64)

    out = []
    seen_test_rows, seen_test_labels = [], []
    for s, (tr, te) in enumerate(zip(train_lists, test_lists)):
        if not tr:
            raise ValueError(f"session_{s + 1}.txt lists no image (a session needs examples)")
        r_tr, y_tr = rows(tr, f"session_{s + 1}.txt")
        r_te, y_te = rows(te, f"test_{s + 1}.txt")
        seen_test_rows.append(r_te)
        seen_test_labels.append(y_te)
        rt, yt = np.concatenate(seen_test_rows), np.concatenate(seen_test_labels)
        out.append(TaskSplit(Batch(features[r_tr], y_tr, task_id=s), Batch(features[rt], yt, task_id=s),
                             s, tuple(int(c) for c in np.unique(y_tr))))
    return out


def cub_session_lists_splits(data_dir=None) -> list[TaskSplit]:
    """The CUB FSCIL sessions on the xlsa17 features of the data root (``cub/res101.mat`` with
    its ``image_files``) and the lists in ``cub/index_list/``."""
    from ppl_cl.data import root as _root
    from ppl_cl.data.loaders import cell_strings, load_matfile, mat_variable, load_cub_features

    cub = load_cub_features(data_dir)
    base = _root.locate("cub", data_dir)
    res_path = base / "cub" / "res101.mat"
    files = cell_strings(mat_variable(load_matfile(res_path), "image_files", res_path), res_path,
                          "image_files")
    train, test = read_session_lists(base / "cub" / "index_list")
    return sessions_from_lists(cub.features.astype(np.float64), files, train, test)
