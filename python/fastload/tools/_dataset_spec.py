"""A dataset named on the command line, `module:Class` (or `module:factory`, or `module:object`)
with optional constructor arguments, turned into the dataset object for `python -m fastload tune`
and `fl.tune`. Every way it can be wrong is a ValueError naming the spec, raised before anything
is measured."""
from __future__ import annotations

import difflib
import importlib
import json
import re
import sys
from typing import Any

__all__ = ["is_spec", "parse_arguments", "load_dataset", "check_map_style"]

_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def is_spec(text: str) -> bool:
    """Whether `text` has the form module:attribute (dotted names on both sides)."""
    return bool(_SPEC.fullmatch(text))


def parse_arguments(text: str) -> tuple[list[Any], dict[str, Any]]:
    """--dataset-args: a JSON object (keyword arguments) or a JSON list (positional ones)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at character {e.pos}): {text!r}") from None
    if isinstance(value, dict):
        return [], value
    if isinstance(value, list):
        return value, {}
    raise ValueError(f"expected a JSON object of keyword arguments or a JSON list of positional ones, got {text!r}")


def _call_text(spec: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    inner = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    text = f"{spec}({', '.join(inner)})"
    return text if len(text) <= 120 else text[:117] + "..."


def load_dataset(spec: str, args: list[Any] | None = None, kwargs: dict[str, Any] | None = None) -> Any:
    """Imports the module, finds the attribute and, if it is a class or a function, calls it with
    the arguments; checks that the result is a map-style dataset (or a fastload source)."""
    if not is_spec(spec):
        raise ValueError(f"{spec!r} is not of the form module:Class (e.g. mydata:Images or pkg.data:make_dataset)")
    module_name, attribute = spec.split(":")
    args, kwargs = list(args or []), dict(kwargs or {})
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        missing = getattr(e, "name", None)
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ValueError(f"cannot import module {module_name!r} ({e}); run from the directory that holds it "
                             f"or add that directory to PYTHONPATH (searched: {', '.join(sys.path[:3])}, ...)") from None
        raise ValueError(f"importing module {module_name!r} failed: {type(e).__name__}: {e}") from None
    except Exception as e:  # noqa: BLE001 - whatever the module's own code raises on import
        raise ValueError(f"importing module {module_name!r} raised {type(e).__name__}: {e}") from None
    obj: Any = module
    where = module_name
    for part in attribute.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            owner = f"module {module_name!r}" if obj is module else where
            raise ValueError(f"{owner} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
        where = f"{where}.{part}" if where != module_name else f"{module_name}:{part}"
    if _is_factory(obj):
        try:
            dataset = obj(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the user's constructor: say what it raised
            raise ValueError(f"{_call_text(spec, args, kwargs)} raised {type(e).__name__}: {e}") from None
        what = _call_text(spec, args, kwargs)
    else:
        if args or kwargs:
            raise ValueError(f"{spec} is a {type(obj).__name__}, not a class or function, so constructor arguments "
                             "(--dataset-args) do not apply to it")
        dataset, what = obj, spec
    check_map_style(dataset, what)
    return dataset


def _is_factory(obj: Any) -> bool:
    """A class or a function to call, not a dataset object that happens to be callable."""
    if isinstance(obj, type):
        return True
    return callable(obj) and not (hasattr(obj, "__getitem__") and hasattr(obj, "__len__"))


def check_map_style(dataset: Any, what: str) -> None:
    """A map-style dataset (__len__ and __getitem__, not a torch IterableDataset) with samples,
    or a fastload source; else a ValueError (TypeError for an IterableDataset) saying what `what`
    gave."""
    from .._sources.protocol import Source, refuse_iterable_dataset

    if isinstance(dataset, Source):
        return
    kind = type(dataset).__name__
    refuse_iterable_dataset(dataset, what)
    if isinstance(dataset, type):
        raise ValueError(f"{what} is the class {dataset.__name__} itself, not a dataset")
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")) or isinstance(dataset, (str, bytes)):
        raise ValueError(f"{what} gave a {kind}, not a map-style dataset: it needs __len__ and __getitem__(i)")
    try:
        size = len(dataset)
    except Exception as e:  # noqa: BLE001 - the user's __len__
        raise ValueError(f"len() of {what} raised {type(e).__name__}: {e}") from None
    if size <= 0:
        raise ValueError(f"{what} is empty: len() is {size}")

