"""A corpus that needs no download: English prose that ships with Python.

Two parts, in this order: every topic of the interactive help (`pydoc_data.topics`), one
document per topic in sorted order; then the docstrings of the standard library, one document
per module, modules in sorted path order. Docstrings are read with `ast` from the source files
(modules are never imported: some have side effects). Paragraphs are re-flowed onto one line
each, so that hard-wrapped prose is not cut into sentence fragments; doctest examples are left
out. About 2 MB of text (Python 3.11).
"""

import ast
import functools
import sysconfig
from collections.abc import Iterator
from pathlib import Path

BUILTIN = "builtin"

# Directories of the standard library that hold tests, tools, vendored or generated code.
_SKIPPED_DIRS = frozenset(
    {
        "test",
        "tests",
        "idlelib",
        "site-packages",
        "dist-packages",
        "lib2to3",
        "lib-dynload",
        "__pycache__",
        "turtledemo",
        "ensurepip",
        "encodings",
        "pydoc_data",
        "venv",
    }
)


_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


_UNDERLINE_CHARS = "*=-~^#"


def _reflow(docstring: str) -> list[str]:
    """Paragraphs of a cleaned docstring, each joined onto one line; doctest blocks and
    heading underlines (`*****`, `=====`) dropped."""
    paragraphs = []
    for block in docstring.split("\n\n"):
        lines = [
            line.strip() for line in block.splitlines() if line.strip(_UNDERLINE_CHARS + " \t")
        ]
        if lines and not lines[0].startswith(">>>"):
            paragraphs.append(" ".join(lines))
    return paragraphs


def pydoc_topic_documents() -> Iterator[tuple[str, str]]:
    """(topic name, text) for every topic of `pydoc_data.topics`, sorted by name."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        text = "\n".join(_reflow(topics[name]))
        if text:
            yield f"pydoc:{name}", text


def stdlib_source_files(stdlib: str | Path | None = None) -> list[Path]:
    """The standard library's `.py` files under `stdlib` (default: this Python's), sorted by
    path relative to it, without tests, IDLE, site-packages and the like."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    files = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if any(p in _SKIPPED_DIRS or p.startswith("config-") for p in parts[:-1]):
            continue
        if parts[-1].startswith("_sysconfigdata"):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def module_docstrings(source: str) -> list[str]:
    """The module, class and function docstrings of Python `source`, in source order (depth
    first, including definitions nested in `if`, `try`, ... blocks), cleaned by
    `ast.get_docstring`. Returns [] for source that does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    docstrings: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, _DOCUMENTED):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                docstrings.append(doc)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):  # definitions sit in statements, never in expressions
                visit(child)

    visit(tree)
    return docstrings


def stdlib_docstring_documents(stdlib: str | Path | None = None) -> Iterator[tuple[str, str]]:
    """(module path, text) per standard-library module that has docstrings, sorted by path."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    for path in stdlib_source_files(root):
        source = path.read_bytes().decode("utf-8", errors="replace")
        paragraphs = [p for doc in module_docstrings(source) for p in _reflow(doc)]
        if paragraphs:
            yield f"stdlib:{path.relative_to(root).as_posix()}", "\n".join(paragraphs)


@functools.cache
def _all_builtin_documents() -> tuple[tuple[str, str], ...]:
    return (*pydoc_topic_documents(), *stdlib_docstring_documents())


def builtin_documents() -> Iterator[tuple[str, str]]:
    """(name, text) of every document of the built-in corpus, in a fixed order. Parsed once
    per process (a few seconds) and kept in memory (about 2 MB), as prepare reads it thrice."""
    yield from _all_builtin_documents()
