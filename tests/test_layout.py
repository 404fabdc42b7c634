"""The package's shape: sources below the Loader, commands above it, no import cycle, and no C++
file that imports a fastload module by name (the bindings receive the Python objects they call
through _C._register_hooks)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import fastload as fl

PACKAGE = Path(fl.__file__).resolve().parent
BINDINGS = Path(__file__).resolve().parents[1] / "csrc" / "bindings"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The import nodes under `if TYPE_CHECKING:` (never run: no cycle at run time)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            out.update(id(n) for child in node.body for n in ast.walk(child))
    return out


def _import_froms(path: Path, *, top_level_only: bool, typing_too: bool = True) -> list[tuple[str, ast.ImportFrom]]:
    """(the fastload module named, the node) of each `from ... import ...` of a file."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    skip = set() if typing_too else _type_checking_only(tree)
    out = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and id(node) not in skip:
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("fastload"):
                out.append((target, node))
    return out


def _imports(path: Path, *, top_level_only: bool, typing_too: bool = True) -> set[str]:
    """The fastload modules a file imports (`from . import x` counts x when x is a module)."""
    found: set[str] = set()
    for target, node in _import_froms(path, top_level_only=top_level_only, typing_too=typing_too):
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            found.add(sub if sub in MODULES else target)
    tree = ast.parse(path.read_text(), str(path))
    skip = set() if typing_too else _type_checking_only(tree)
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import) and id(node) not in skip:
            found.update(a.name for a in node.names if a.name.startswith("fastload"))
    found.discard(_module_name(path))
    return {m for m in found if m in MODULES}


FILES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
MODULES = set(FILES) | {"fastload._C"}


def _graph(top_level_only: bool, typing_too: bool = True) -> dict[str, set[str]]:
    return {m: _imports(p, top_level_only=top_level_only, typing_too=typing_too) for m, p in FILES.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_graph_reads_the_package():
    graph = _graph(top_level_only=True)
    assert "fastload._sources.protocol" in graph["fastload._loader"], graph["fastload._loader"]
    assert "fastload._loader" in graph["fastload.tools._tune_measure"], graph["fastload.tools._tune_measure"]
    assert "fastload.tools._tune_measure" in graph["fastload.tools.tune"], graph["fastload.tools.tune"]
    assert "fastload._columns.spec" in graph["fastload._columns.ragged"], graph["fastload._columns.ragged"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_module_level_imports_have_no_cycle():
    # Imports inside functions (made lazily, on first use) are left out: a module imported there
    # is never half-initialised when it is used.
    graph = _graph(top_level_only=True)
    graph = {m: {n for n in deps if n != "fastload"} for m, deps in graph.items()}  # __init__ re-exports only
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


@pytest.mark.parametrize("below, above", [
    ("fastload._sources", "fastload._loader"),
    ("fastload._sources", "fastload.tools"),
    ("fastload._sources", "fastload._state"),
    ("fastload._sources", "fastload._stats"),
    ("fastload._loader", "fastload.tools"),
    # the rooms the sources build on sit below them (_writing writes the format _sources/directory.py reads)
    *[(room, above) for room in ("fastload._columns", "fastload._images", "fastload._writing", "fastload._workers")
      for above in ("fastload._sources", "fastload._loader", "fastload.tools", "fastload._state", "fastload._stats")
      if (room, above) != ("fastload._writing", "fastload._sources")],
])
def test_no_module_imports_upward(below, above):
    graph = _graph(top_level_only=False)  # lazy imports included
    upward = {m: sorted(n for n in deps if n == above or n.startswith(above + "."))
              for m, deps in graph.items() if m == below or m.startswith(below + ".")}
    assert not any(upward.values()), {m: deps for m, deps in upward.items() if deps}


def test_bindings_import_no_fastload_module_by_name():
    pattern = re.compile(r"""import\s*\(\s*"fastload""")
    named = [f"{p.name}:{i}" for p in sorted(BINDINGS.glob("*.*"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert BINDINGS.is_dir() and not named, named


def test_hooks_are_registered_and_checked():
    from fastload import _C, _advice, _gpu_memory

    warn = _advice.stall_warning
    with pytest.raises(ValueError, match="sample_error must be an exception class, got 3"):
        _C._register_hooks(sample_error=3, release_cache=_gpu_memory.release_cached, stall_warning=warn)
    with pytest.raises(ValueError, match="release_cache must be callable, got 'no'"):
        _C._register_hooks(sample_error=fl.SampleError, release_cache="no", stall_warning=warn)
    with pytest.raises(ValueError, match="stall_warning must be callable, got 'no'"):
        _C._register_hooks(sample_error=fl.SampleError, release_cache=_gpu_memory.release_cached, stall_warning="no")
    with pytest.raises(TypeError):
        _C._register_hooks(fl.SampleError, _gpu_memory.release_cached, warn)  # keywords only


def test_a_failing_sample_raises_the_registered_class():
    # SampleError reaches Python through the class fastload/__init__.py registered.
    class Bad:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i == 5:
                raise KeyError("sample five")
            return {"x": i}

    with pytest.raises(fl.SampleError) as info:
        list(fl.Loader(Bad(), batch_size=4, num_threads=1))
    assert isinstance(info.value.__cause__, KeyError), info.value.__cause__


@pytest.mark.parametrize("module", ["fastload._loader", "fastload._stats"])
def test_the_loader_reaches_storage_only_through_the_source_protocol(module):
    # The Loader asks a source its declared member stored_files() (via _sources/protocol.py);
    # it never imports the object-storage layer itself, lazily or not.
    graph = _graph(top_level_only=False)
    storage = sorted(n for n in graph[module] if n == "fastload._storage" or n.startswith("fastload._storage."))
    assert not storage, storage


def test_no_module_imports_another_modules_private_names():
    # `from .x import _y` across modules couples them through what x keeps private; a private
    # module itself (`from . import _C`, `from .. import _lifecycle`) is a module, not a name.
    found = []
    for module, path in sorted(FILES.items()):
        for target, node in _import_froms(path, top_level_only=False):
            for alias in node.names:
                name = alias.name
                if name.startswith("_") and not name.startswith("__") and f"{target}.{name}" not in MODULES:
                    found.append(f"{module}:{node.lineno} imports {name} from {target}")
    assert not found, "\n".join(found)


def test_imports_inside_functions_make_no_cycle_either():
    # A lazy import hides a cycle from the module-level graph (it runs later), but the two modules
    # still depend on each other. Imports under `if TYPE_CHECKING:` never run and are left out.
    graph = _graph(top_level_only=False, typing_too=False)
    graph = {m: {n for n in deps if n != "fastload"} for m, deps in graph.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_source_protocol_declares_every_member_the_loader_asks():
    # Every optional member read off a source by getattr/hasattr in the Loader's modules is one
    # that protocol.OPTIONAL_MEMBERS declares with its default.
    from fastload._sources.protocol import OPTIONAL_MEMBERS

    asked = set()
    for module in ("fastload._loader", "fastload._config", "fastload._schedules", "fastload._stats",
                   "fastload._storage.plan", "fastload._sources.mix", "fastload._sources.pack"):
        tree = ast.parse(FILES[module].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr") \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                    and getattr(node.args[0], "id", None) in ("source", "p", "s"):
                asked.add(node.args[1].value)
    assert asked <= set(OPTIONAL_MEMBERS) | {"__getitems__", "shard_rows"}, asked - set(OPTIONAL_MEMBERS)
    assert {"default_order", "string_lists", "fingerprint", "check_fingerprint", "stored_files"} <= set(OPTIONAL_MEMBERS)


def test_the_guards_find_what_they_forbid(tmp_path):
    # The private-name and lazy-cycle guards see the patterns they forbid.
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from .x import _y\nif TYPE_CHECKING:\n    from .z import w\n")
    tree = ast.parse(f.read_text())
    lazy = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert [a.name for n in lazy for a in n.names] == ["_y", "w"]
    assert len(_type_checking_only(tree)) >= 2  # the If's import and its alias
