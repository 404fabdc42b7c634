"""Hive partition columns of a Parquet source: the `key=value` directory names that pyarrow's
`write_to_dataset(partition_cols=...)` and pandas' `to_parquet(partition_cols=...)` write, read
back as columns as pyarrow's dataset discovery reads them (`pyarrow.dataset.dataset(root,
partitioning="hive")`). A file's partition values are constants of all its rows: they come from
its path, no data is read.

The rules (pyarrow's): a directory name with a `=` is `key=value`, both URL-decoded
(`city=a%20b` is "a b"); `__HIVE_DEFAULT_PARTITION__` is null; a key missing from a file's
directories is null for its rows; a key whose values all parse as int32 is int32, any other is a
string (null in every file: a string). Which directory names count: those below the directory
given (a prefix for a URL); for a list of files, every directory of each file's path as given; a
single file given alone has none."""
from __future__ import annotations

import urllib.parse
from typing import Any, NamedTuple, Sequence

__all__ = ["NULL_VALUE", "Partitions", "discover"]

NULL_VALUE = "__HIVE_DEFAULT_PARTITION__"


class Partitions(NamedTuple):
    """The partition columns of a source's files: their names and pyarrow types in the order they
    first appear, and per file its value of each (None: null)."""
    names: list[str]
    types: list[Any]
    values: list[list[Any]]  # [file][column]

    def columns(self, k: int, n: int, which: Sequence[int]) -> list[tuple[str, Any]]:
        """Columns `which` of file k for n of its rows: (name, a pyarrow array of its value n times)."""
        import pyarrow as pa  # noqa: PLC0415 - only Parquet sources get here

        return [(self.names[j], pa.repeat(pa.scalar(self.values[k][j], type=self.types[j]), n)) for j in which]


def _unescape(text: str, segment: str, where: str) -> str:
    try:
        return urllib.parse.unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise ValueError(f"{where}: the directory name {segment!r} is not valid UTF-8 once URL-decoded") from None


def keys_of(dirs: Sequence[str], where: str) -> dict[str, str | None]:
    """The key=value pairs of one file's directory names, in path order (None: null)."""
    out: dict[str, str | None] = {}
    for segment in dirs:
        if "=" not in segment:
            continue
        raw_key, raw_value = segment.split("=", 1)
        key, value = _unescape(raw_key, segment, where), _unescape(raw_value, segment, where)
        if key in out:
            raise ValueError(f"{where}: the partition key {key!r} appears twice in the file's directories "
                             f"({out[key]!r} and {value!r}): which value its rows hold is ambiguous")
        out[key] = None if value == NULL_VALUE else value
    return out


def _infer(key: str, texts: list[str]) -> tuple[Any, list[Any]]:
    """The type of a key (int32 when every value parses as one, as pyarrow's cast parses it,
    else string) and its values of that type."""
    import pyarrow as pa  # noqa: PLC0415

    try:
        return pa.int32(), pa.array(texts, pa.string()).cast(pa.int32()).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.string(), list(texts)


def discover(files: Sequence[str], dirs: Sequence[Sequence[str]]) -> Partitions:
    """The partition columns of `files`, given the directory names of each that count (see the
    module's docstring). No file has one: no columns."""
    import pyarrow as pa  # noqa: PLC0415

    per_file = [keys_of(d, f) for f, d in zip(files, dirs)]
    names: list[str] = []
    for keys in per_file:
        names += [k for k in keys if k not in names]
    types, columns = [], []
    for name in names:
        given = [keys.get(name) for keys in per_file]
        texts = [v for v in given if v is not None]
        # Null in every file: no value says its type (pyarrow refuses it); a string column of
        # nulls is refused by the null check unless fill_null names it, or columns=[...] drops it.
        t, typed = _infer(name, texts) if texts else (pa.string(), [])
        it = iter(typed)
        types.append(t)
        columns.append([next(it) if v is not None else None for v in given])
    return Partitions(names, types, [list(row) for row in zip(*columns)] if names else [[] for _ in files])
