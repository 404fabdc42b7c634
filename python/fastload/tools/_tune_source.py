"""What ``fl.tune`` and ``python -m fastload tune`` measure: a path, URL, array, ``module:Class`` or
dataset object turned into the source a Loader reads. Paths and URLs are opened by the library's
own constructors (fl.Dataset.open, fl.Parquet, fl.Windows.from_files, fl.Arrow over a Hugging Face
dataset), picked by what the path holds, so every kind of source the Loader reads tunes, and each
constructor's own checks and messages apply; objects go through the Loader's as_source."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import numpy as np

from .._sources.arrays import Dataset, Windows
from .._sources.arrow import Arrow
from .._sources.parquet import Parquet
from .._sources.protocol import Source, as_source
from .._sources.python import PythonSource
from ._dataset_spec import is_spec, load_dataset

__all__ = ["SourceLike", "FORMATS", "open_source", "as_tune_source"]

# A path, an array, a fastload source, "module:Class", or any map-style dataset object.
SourceLike = Union[Dataset, Windows, np.ndarray, str, "os.PathLike[str]", Any]

# What a path may hold (format=None: found from the path itself).
FORMATS = ("directory", "parquet", "hf", "npy", "tokens")
_URL_SCHEMES = ("s3://", "gs://", "gcs://", "http://", "https://")
# A folder Hugging Face's Dataset.save_to_disk wrote holds these (and its .arrow files).
_HF_FILES = ("state.json", "dataset_info.json")


def _is_url(path: Any) -> bool:
    return isinstance(path, str) and path.startswith(_URL_SCHEMES)


def _parquet_under(folder: Path) -> bool:
    return any(f.endswith(".parquet") for _, _, files in os.walk(folder) for f in files)


def path_format(path: str | os.PathLike[str], window: tuple[int, int] | None) -> str:
    """What a path holds, from the path: a folder with a manifest.json is a dataset directory, one
    with state.json and dataset_info.json a saved Hugging Face dataset, one with .parquet files
    (at any depth) Parquet; a .parquet file is Parquet, a .npy file an array, any other file raw
    tokens. A URL is Parquet if it ends in .parquet, token files with a window, else a dataset
    directory (pass format= for a prefix of Parquet files). Raises ValueError for a folder that is
    none of these, or a path that is neither a file nor a folder."""
    if _is_url(path):
        text = str(path)
        return "parquet" if text.endswith(".parquet") else "tokens" if window is not None else "directory"
    p = Path(path)
    if p.is_dir():
        if (p / "manifest.json").exists() or any(p.glob("*.npy")):  # an unfinished write: Dataset.open says so
            return "directory"
        if all((p / name).exists() for name in _HF_FILES):
            return "hf"
        if (p / "dataset_dict.json").exists():
            raise ValueError(f"{str(p)!r} is a Hugging Face DatasetDict: name one split's folder (e.g. {p / 'train'})")
        if _parquet_under(p):
            return "parquet"
        raise ValueError(f"{str(p)!r} holds no source fastload reads: manifest.json is missing (a dataset directory "
                         "from fl.write_dataset), and it has no .parquet files and no Hugging Face dataset "
                         f"(save_to_disk's {' and '.join(_HF_FILES)})")
    if not p.exists():
        raise ValueError(f"no such file or directory: {str(p)!r}")
    if not p.is_file():
        raise ValueError(f"{str(p)!r} is neither a regular file nor a directory")
    return {".parquet": "parquet", ".npy": "npy"}.get(p.suffix, "tokens")


def open_source(path: str | os.PathLike[str], window: tuple[int, int] | None = None, dtype: Any = None,
                format: str | None = None) -> Source:
    """A source from a path or URL, opened as fl.Loader's users open it (see path_format for how
    the kind is found; ``format`` names it instead, one of FORMATS):

    - a dataset directory: ``fl.Dataset.open(path)``;
    - Parquet (a file, a folder of part files, a URL): ``fl.Parquet(path)``;
    - a folder from Hugging Face's ``save_to_disk``: ``fl.Arrow(datasets.load_from_disk(path))``;
    - a .npy file: memory-mapped, one column "x", or token windows over a 1-D array with ``window``;
    - raw tokens (``dtype``, uint16 by default) with ``window``: ``fl.Windows.from_files([path], ...)``.

    Raises ValueError saying what is wrong (an option that does not apply to the kind included)."""
    if format is not None and format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    kind = format or path_format(path, window)
    if kind in ("directory", "parquet", "hf"):
        what = {"directory": "a dataset directory", "parquet": "Parquet", "hf": "a Hugging Face dataset"}[kind]
        if window is not None:
            raise ValueError(f"--window applies to a token file, not to {what}")
        if dtype is not None:
            raise ValueError(f"--dtype applies to a raw token file, not to {what} (it records every column's dtype)")
        if kind == "directory":
            if format is None and _is_url(path):  # guessed from a URL: say what else it could be
                try:
                    return Dataset.open(path)
                except (ValueError, OSError) as e:
                    raise ValueError(f"{e} (for a prefix of Parquet files pass --format parquet, or format='parquet' "
                                     "to fl.tune)") from None
            return Dataset.open(path)
        if kind == "parquet":
            return Parquet(path)
        return Arrow(_load_from_disk(path))
    if kind == "npy":
        array = _load_npy(Path(path))
        if dtype is not None:
            raise ValueError(f"--dtype applies to a raw token file; {Path(path).name} is a .npy file, which carries its "
                             f"dtype ({array.dtype})")
        if window is None:
            return Dataset({"x": array})
        if array.ndim != 1:
            raise ValueError(f"--window needs a 1-D array of tokens; {Path(path).name} has shape {array.shape}")
        return Windows(array, length=window[0], stride=window[1])
    name = str(path) if _is_url(path) else Path(path).name
    if window is None:
        raise ValueError(f"{name} is not a .npy file, so it is read as raw tokens, which needs --window "
                         f"LENGTH[:STRIDE] (and --dtype if they are not uint16)")
    token_dtype = np.dtype(dtype if dtype is not None else np.uint16)
    if not _is_url(path):
        size = Path(path).stat().st_size
        if size < token_dtype.itemsize:
            raise ValueError(f"{name} holds no {token_dtype} tokens ({size} bytes)")
        if size % token_dtype.itemsize:
            raise ValueError(f"{name} is {size} bytes, not a whole number of {token_dtype} tokens "
                             f"({token_dtype.itemsize} bytes each); is --dtype right?")
    return Windows.from_files([path], token_dtype, length=window[0], stride=window[1])


def _load_from_disk(path: str | os.PathLike[str]) -> Any:
    try:
        import datasets  # noqa: PLC0415 - only for this kind of folder
    except ImportError:
        raise ValueError(f"{os.fspath(path)} is a Hugging Face dataset folder; reading it needs the datasets "
                         "package: pip install datasets") from None
    return datasets.load_from_disk(os.fspath(path))


def _load_npy(p: Path) -> np.ndarray:
    """A .npy file memory-mapped, or ValueError saying why it cannot be a source (np.load raises
    EOFError on an empty file, and accepts dtypes fastload cannot load)."""
    try:
        array = np.load(p, mmap_mode="r", allow_pickle=False)
    except (EOFError, ValueError, OSError, TypeError) as e:
        raise ValueError(f"{p.name} is not a readable .npy array ({type(e).__name__}: {e or 'empty file'})") from None
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{p.name} is not a .npy array")
    if array.dtype.kind not in "iufcb":
        raise ValueError(f"{p.name} holds {array.dtype} values; fastload loads bool and numeric arrays")
    if array.ndim == 0 or array.shape[0] == 0:
        raise ValueError(f"{p.name} has shape {array.shape}: no samples to load")
    return array


def as_tune_source(source: SourceLike, window: int | tuple[int, int] | None, dtype: Any,
                   dataset_args: Mapping[str, Any] | Sequence[Any] | None = None, seed: int = 0,
                   format: str | None = None) -> tuple[Source, str]:
    """The source to measure and its name for the report. Paths and URLs through open_source;
    arrays as a one-column Dataset (token Windows with `window`); "module:Class" (with
    `dataset_args`) or any other object as the Loader reads it (as_source: a map-style dataset
    becomes a PythonSource, whose first sample is read now, Arrow data fl.Arrow). Every problem is
    a ValueError or TypeError here, before anything is measured."""
    if isinstance(window, int):
        window = (window, window)
    spec = isinstance(source, str) and not os.path.exists(source) and not _is_url(source) and is_spec(source)
    if dataset_args is not None and not spec:
        raise ValueError(f"dataset_args apply to a 'module:Class' source, not to {source!r}")
    if format is not None and (spec or not isinstance(source, (str, os.PathLike))):
        raise ValueError(f"format applies to a path or a URL, not to {source!r}")
    if isinstance(source, np.ndarray):
        if dtype is not None:
            raise ValueError("dtype applies to a token file path; an array carries its dtype")
        if window is None:
            return Dataset({"x": source}), "array"
        return Windows(source, length=window[0], stride=window[1]), "array"
    if spec or not isinstance(source, (str, os.PathLike)):
        if window is not None or dtype is not None:
            what = "a Dataset or Windows" if isinstance(source, Source) else "a Python dataset"
            raise ValueError(f"window and dtype apply to a path or an array, not to {what}")
        if spec:
            if isinstance(dataset_args, Mapping):
                args, kwargs = [], dict(dataset_args)
            else:
                args, kwargs = list(dataset_args or []), {}
            dataset, name = load_dataset(source, args, kwargs), source
        else:
            dataset = source
            name = type(source.dataset if isinstance(source, PythonSource) else source).__name__
        try:  # what the Loader reads, as the Loader makes it (a factory may return fl.Dataset or fl.Windows)
            return as_source(dataset, seed=seed), name
        except (TypeError, ValueError) as e:
            raise type(e)(f"{name}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the dataset's own __getitem__(0)
            raise ValueError(f"{name}: reading sample 0 (to learn the batch's structure) raised "
                             f"{type(e).__name__}: {e}") from None
    return open_source(source, window, dtype, format), os.fspath(source)
