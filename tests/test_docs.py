"""The front door stays short, its links resolve, and nothing the long README documented is lost."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")

# Every section heading of the README before it was split (2026-11-27), and the page holding it now.
OLD_SECTIONS = {
    "Set-up on a fresh machine": "install.md", "A manylinux wheel": "install.md",
    "Quick start": "../README.md", "API": "api.md", "Sampling contract": "api.md", "Resume": "api.md",
    "Python datasets": "python-datasets.md",
    "Migrating from `torch.utils.data.DataLoader`": "python-datasets.md",
    "Data on disk": "data-on-disk.md", "Dataset directories": "data-on-disk.md",
    "Token files and windows": "data-on-disk.md", "Time series": "data-on-disk.md",
    "Ragged columns": "data-on-disk.md", "Columns of many arrays": "data-on-disk.md",
    "Blending datasets": "blending.md", "Distributed training": "distributed.md", "GPU": "gpu.md",
    "Running the GPU check": "gpu.md", "Knobs and how to tune them": "tuning.md",
    "`python -m fastload tune`": "tuning.md", "Measured results": "results.md",
    "Architecture": "architecture.md", "Layout": "architecture.md",
}


def headings(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # not the comments in code
    return {m[1].strip() for m in re.finditer(r"(?m)^#{1,6} (.+)$", text)}


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_the_readme_is_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= 200


def test_every_relative_link_in_the_readme_and_the_docs_resolves():
    checked = 0
    for page in [README, *PAGES]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            assert resolved.exists(), f"{page.name}: {target} does not exist"
            if fragment:
                assert fragment in {anchor(h) for h in headings(resolved)}, f"{page.name}: no #{fragment} in {path}"
            checked += 1
    assert checked >= 20  # the README's table of pages and each page's way back


def test_every_old_readme_section_is_in_a_page():
    for heading, page in OLD_SECTIONS.items():
        assert heading in headings(REPO / "docs" / page), f"{heading!r} is not in {page}"


def test_the_readme_links_every_page():
    linked = {t.split("#")[0] for t in LINK.findall(README.read_text())}
    assert {f"docs/{p.name}" for p in PAGES} <= linked


def test_the_install_page_quotes_auditwheel_show():
    text = " ".join((REPO / "docs" / "install.md").read_text().split())
    assert 'is consistent with the following platform tag: "manylinux_2_27_x86_64"' in text


# ---------------------------------------------------------------------------- names of files
# Comments and pages that name a file (a C++ source, a Python module, a test or benchmark) or a
# fastload module must name one that exists: a moved file leaves no stale pointer behind.
SKIP_DIRS = {".git", ".venv", "build", "dist", "__pycache__"}
EXTERNAL = {"cuda.h", "jpeglib.h", "jconfig.h", "jerror.h"}  # headers of other projects
NATIVE_PATH = re.compile(r"(?<![\w/.])(?:csrc/)?((?:core|bindings|cuda|runtime|image)/\w+\.(?:h|cpp|\*))")
FILE_NAME = re.compile(r"(?<![\w.])(\w+\.(?:h|cpp|py))\b")
MODULE = re.compile(r"\bfastload((?:\.\w+)+)")


def _named_in_comments_and_pages() -> list[tuple[str, str]]:
    """(where, text) of every C++ comment line, every line of the fastload package (its comments
    and docstrings) and every line of the README, csrc/README.md and docs/."""
    out = []
    for p in sorted((REPO / "csrc").rglob("*")):
        if p.suffix in (".h", ".cpp"):
            out += [(f"{p.relative_to(REPO)}:{i}", line[line.index("//"):])
                    for i, line in enumerate(p.read_text().splitlines(), 1) if "//" in line]
    for p in [README, REPO / "csrc" / "README.md", *PAGES, *sorted((REPO / "python" / "fastload").rglob("*.py"))]:
        out += [(f"{p.relative_to(REPO)}:{i}", line) for i, line in enumerate(p.read_text().splitlines(), 1)]
    return out


def _module_exists(dotted: str) -> bool:
    """fastload.<dotted> names a module or package of the tree, or an attribute of one."""
    import fastload

    here = REPO / "python" / "fastload"
    for k, part in enumerate(dotted.split(".")):
        if (here / part).is_dir():
            here = here / part
        elif (here / f"{part}.py").exists() or (k > 0 and here.is_dir()):
            return True  # a module, or an attribute of a package (its __init__ re-exports it)
        else:
            return k == 0 and hasattr(fastload, part)  # fastload.Loader, fastload._C
    return True


def test_comments_and_pages_name_only_files_and_modules_that_exist():
    files = {p.name for p in REPO.rglob("*") if p.is_file() and not SKIP_DIRS & set(p.relative_to(REPO).parts)}
    missing = []
    for where, text in _named_in_comments_and_pages():
        missing += [f"{where}: {m}" for m in NATIVE_PATH.findall(text) if not any((REPO / "csrc").glob(m))]
        missing += [f"{where}: {m}" for m in FILE_NAME.findall(text) if m not in files and m not in EXTERNAL]
        missing += [f"{where}: fastload{m}" for m in MODULE.findall(text) if not _module_exists(m.strip("."))]
    assert not missing, "\n".join(missing)


def test_the_file_name_check_finds_a_stale_name():
    assert NATIVE_PATH.findall("see core/sampler.h and csrc/bindings/loader_binding.h") == [
        "core/sampler.h", "bindings/loader_binding.h"]
    assert not any((REPO / "csrc").glob("bindings/loader_binding.h"))
    assert FILE_NAME.findall("(_stream.py, tests/test_images_rng.py)") == ["_stream.py", "test_images_rng.py"]
    assert _module_exists("_columns.spec.ColumnSpec") and _module_exists("Loader")
    assert not _module_exists("_column_kinds.ArrayColumn") and not _module_exists("_python_source")
