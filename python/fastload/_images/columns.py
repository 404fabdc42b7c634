"""Image columns of Arrow and Parquet data (`decode={"col": fl.Image(...)}` on fl.Arrow and
fl.Parquet): which stored columns hold a column's encoded images (a binary column, or a struct
of `bytes` and `path` as a Hugging Face `Image` feature stores it), the native request that
decodes them per row on the collation threads, and the refusal of a Hugging Face `Image` column
read without decode=."""
from __future__ import annotations

import json
from typing import Any, Mapping

from .fallback import fallback_for
from .spec import Image

__all__ = ["image_columns", "decoded_request", "hf_image_features", "refuse_undecoded_images"]


def hf_image_features(table_metadata: Mapping[bytes, bytes]) -> list[str]:
    """The columns a Hugging Face dataset declares as `Image` features (from the schema's
    "huggingface" metadata, which `datasets` writes with its Arrow and Parquet files)."""
    raw = table_metadata.get(b"huggingface")
    try:
        features = ((json.loads(raw) if raw else {}).get("info") or {}).get("features")
    except (ValueError, AttributeError):
        return []
    found: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, dict):
            return
        for name, feature in node.items():
            if isinstance(feature, dict) and feature.get("_type") == "Image":
                found.append(prefix + name)
            elif isinstance(feature, dict) and "_type" not in feature:  # a dict of features: a struct
                walk(feature, prefix + name + ".")

    walk(features, "")
    return found


def _is_binary(info: dict | None) -> bool:
    return info is not None and info["kind"] == "bytes" and "binary" in info["type"]


def _is_media(info: dict | None) -> bool:
    """A struct<bytes, path> (Hugging Face Image / Audio), which the native table keeps as one column."""
    return info is not None and info["type"].startswith("struct<bytes, path>")


def _is_text(info: dict | None) -> bool:
    return info is not None and info["kind"] == "bytes" and "binary" not in info["type"]


def image_columns(decode: Any, infos: Mapping[str, dict], what: str) -> dict[str, tuple[str, str | None]]:
    """{name: (bytes column, path column or None)} for decode={name: fl.Image}: `name` is a binary
    column, or a struct with a binary field `bytes` (and a string field `path`: the file read
    when a row's bytes are null), as a Hugging Face Image feature is stored."""
    if decode is None:
        return {}
    if not isinstance(decode, Mapping):
        raise TypeError(f"decode must be a dict of column -> fl.Image, got {type(decode).__name__}")
    out: dict[str, tuple[str, str | None]] = {}
    for name, spec in decode.items():
        if not isinstance(spec, Image):
            raise TypeError(f"decode[{name!r}] must be an fl.Image, got {type(spec).__name__}")
        if spec.size is None:
            raise ValueError(f"decode[{name!r}]: an image column needs fl.Image(size=...) (crop='none' without a "
                             "size keeps an image folder's first size; a column has no first file)")
        if _is_binary(infos.get(name)) or _is_media(infos.get(name)):
            out[name] = (name, None)  # a struct<bytes, path>: the native side reads both fields
        elif _is_binary(infos.get(name + ".bytes")):
            path = name + ".path"
            out[name] = (name + ".bytes", path if _is_text(infos.get(path)) else None)
        elif name in infos or name + ".bytes" in infos:
            leaf = infos.get(name) or infos[name + ".bytes"]
            raise ValueError(f"decode[{name!r}]: {what} column {leaf['name']!r} is {leaf['type']}; decode= takes a "
                             "binary column, or a struct of bytes (binary) and path (string) as a Hugging Face Image "
                             "feature is stored")
        else:
            raise ValueError(f"decode names the column {name!r}, which the data does not have; it has "
                             f"{sorted({n.split('.')[0] for n in infos})}")
    return out


def decoded_request(name: str, spec: Image, columns: tuple[str, str | None]) -> tuple:
    """The native request (csrc/bindings/arrow.cpp: requests_of) of an image column."""
    bytes_column, path_column = columns
    return (bytes_column, 0, b"\0", False, b"", False, False, (), (), False, spec.native(), fallback_for(spec),
            path_column or "", name)


def refuse_undecoded_images(table_metadata: Mapping[bytes, bytes], selected: list[str], decoded: Mapping[str, Any],
                            what: str) -> None:
    """A Hugging Face Image column read without decode= is refused, naming decode= as the way."""
    for name in hf_image_features(table_metadata):
        if name in decoded:
            continue
        if any(s == name or s.startswith(name + ".") for s in selected):
            raise ValueError(f"{what} column {name!r} is a Hugging Face Image feature (struct<bytes, path>: encoded "
                             "image or audio files), not read natively as it is: decode its images with "
                             f"decode={{{name!r}: fl.Image(224)}} (see docs/images.md), or drop it with columns=[...]")
