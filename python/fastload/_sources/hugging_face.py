"""Hugging Face `datasets.Dataset` as Arrow: its table and indices mapping, what its format asks
(`with_format` / `set_format` columns, `with_transform` / `set_transform`), and the shapes of its
`Array2D`..`Array5D` features (stored as lists of lists, their shape in the feature's metadata).
Nothing here imports `datasets`: the dataset's own attributes are read."""
from __future__ import annotations

import json
from typing import Any

__all__ = ["is_hf_dataset", "hf_parts", "hf_transform", "hf_format_columns", "hf_array_shapes",
           "HF_ARRAY_EXTENSION"]

# The extension name of Hugging Face's ArrayND storage: "datasets.features.features.Array2DExtensionType".
HF_ARRAY_EXTENSION = ("datasets.features.features.Array", "ExtensionType")


def is_hf_dataset(obj: Any) -> bool:
    return type(obj).__name__ == "Dataset" and type(obj).__module__.startswith("datasets") and hasattr(obj, "_data")


def hf_parts(ds: Any) -> tuple[Any, Any, list[str]]:
    """A Hugging Face Dataset's Arrow table, its indices table (or None) and its cache files."""
    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    indices = getattr(ds, "_indices", None)
    if indices is not None:
        indices = indices.table if hasattr(indices, "table") else indices
    files = [f["filename"] for f in getattr(ds, "cache_files", None) or [] if "filename" in f]
    return table, indices, files


def hf_transform(ds: Any) -> Any:
    """The transform a dataset applies when indexed (`with_transform` / `set_transform`), or None."""
    if getattr(ds, "_format_type", None) != "custom":
        return None
    return (getattr(ds, "_format_kwargs", None) or {}).get("transform")


def describe_transform(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module and module not in ("__main__", "builtins") else name


def hf_format_columns(ds: Any) -> list[str] | None:
    """The columns a dataset's format gives (`with_format(columns=...)`), None for all. Format
    arguments fastload would not honour (a dtype, a device) are refused, naming them."""
    kwargs = {k: v for k, v in (getattr(ds, "_format_kwargs", None) or {}).items() if v is not None}
    if kwargs:
        kind = getattr(ds, "_format_type", None)
        given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise ValueError(f"the Hugging Face dataset's format is with_format({kind!r}, {given}): fastload gives each "
                         "column's stored dtype on the Loader's device and applies no format arguments; use "
                         f"ds.with_format({kind!r}) and convert the batch (e.g. batch['x'].to(torch.float16)), or "
                         "pass the dataset to fl.Loader wrapped in a class whose __getitem__ formats it")
    columns = getattr(ds, "_format_columns", None)
    if columns is None or getattr(ds, "_output_all_columns", False):
        return None
    return list(columns)


def _shape_of(feature: Any) -> tuple[int, ...] | None:
    """An ArrayND feature's shape (None for a dynamic first dimension: -1), or None if it is not one."""
    if not isinstance(feature, dict) or not str(feature.get("_type", "")).startswith("Array"):
        return None
    shape = feature.get("shape")
    if not isinstance(shape, list) or not shape:
        return None
    return tuple(-1 if d is None else int(d) for d in shape)


def _walk(features: Any, prefix: str, out: dict[str, tuple[int, ...]]) -> None:
    if not isinstance(features, dict):
        return
    for name, feature in features.items():
        shape = _shape_of(feature)
        if shape is not None:
            out[prefix + name] = shape
        elif isinstance(feature, dict) and "_type" not in feature:  # a dict of features: a struct
            _walk(feature, prefix + name + ".", out)


def hf_array_shapes(table_metadata: dict[bytes, bytes], columns: list[dict]) -> dict[str, tuple[int, ...]]:
    """{column: shape} of the ArrayND features: from each column's extension type (a dataset in
    memory or on disk), else from the schema's "huggingface" metadata (Parquet that `datasets`
    wrote, read without its extension types)."""
    shapes: dict[str, tuple[int, ...]] = {}
    raw = table_metadata.get(b"huggingface")
    if raw:
        try:
            info = json.loads(raw)
        except ValueError:
            info = None
        if isinstance(info, dict):
            _walk((info.get("info") or {}).get("features"), "", shapes)
    for c in columns:
        ext = c["extension"]
        if ext.startswith(HF_ARRAY_EXTENSION[0]) and ext.endswith(HF_ARRAY_EXTENSION[1]):
            try:
                shape, _dtype = json.loads(c["extension_metadata"])
                shapes[c["name"]] = tuple(-1 if d is None else int(d) for d in shape)
            except (ValueError, TypeError):
                pass  # an unreadable shape: refused as an unknown extension by the caller
    return shapes
