"""No import runs back up the layers (issue 52 item 5): every module under src/pretrain imports
only from its own layer or below, the order being the numbered list of src/pretrain/README.md.

Every import counts: module-level, inside functions, under `if TYPE_CHECKING:`, `import
pretrain.x`, `from pretrain.x import y`, relative ones, and `importlib.import_module("pretrain...")`
with a literal name, but not `from pretrain import objectives` where that package's
`__init__.py` is a bare docstring (its path is read; none of its code runs). A module's layer is
that of the longest entry of the list it falls under (`objectives.configs` before `objectives`);
an entry may hold `*` (`objectives.*_config`)."""

import ast
import re
from fnmatch import fnmatchcase
from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "src" / "pretrain"
README = PACKAGE / "README.md"
LAYER_LINE = re.compile(r"^\s+(\d+)\.\s+(.+)$")


def layer_order(readme: str = README.read_text()) -> list[list[str]]:
    """The README's `## Layers` section: one numbered line a layer, bottom first, each a
    comma-separated list of modules or packages named from `pretrain.`."""
    section = readme.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [LAYER_LINE.match(line) for line in section.splitlines()]
    rows = [row for row in rows if row]
    assert [int(row[1]) for row in rows] == list(range(1, len(rows) + 1)), "layers: 1, 2, 3 ..."
    return [[name.strip().strip("`") for name in row[2].split(",")] for row in rows]


def module_names() -> dict[str, Path]:
    """Dotted name (`pretrain.data.stream`) -> file, for every module of the package."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported_modules(path: Path, name: str, known: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, dotted module name) of every import of `pretrain` in the file, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:  # `from pretrain.models import configs`: the submodule
                full = f"{base}.{alias.name}"
                found.append((node.lineno, full if full in known else base))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return sorted(
        {
            (line, target)
            for line, target in found
            if target.startswith("pretrain.") and not is_bare_package(target, known)
        }
    )


def is_bare_package(module: str, known: dict[str, Path]) -> bool:
    """True for a package whose `__init__.py` holds nothing but a docstring."""
    path = known.get(module)
    if path is None or path.name != "__init__.py":
        return False
    body = ast.parse(path.read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def layer_of(module: str, order: list[list[str]]) -> int | None:
    """Index (0 = bottom) of the longest entry of `order` that `module` (dotted, with its
    `pretrain.` prefix) is or lies under; None when none does."""
    best, best_length = None, -1
    for index, names in enumerate(order):
        for entry in names:
            full = f"pretrain.{entry}"
            inside = module == full or module.startswith(full + ".") or fnmatchcase(module, full)
            if inside and len(full) > best_length:
                best, best_length = index, len(full)
    return best


def back_arrows(order: list[list[str]]) -> list[str]:
    """`file:line: module (layer) imports target (layer)` for every import from a higher layer."""
    known = module_names()
    arrows = []
    for name, path in known.items():
        own = layer_of(name, order)
        for line, target in imported_modules(path, name, known):
            theirs = layer_of(target, order)
            if own is not None and theirs is not None and theirs > own:
                where = path.relative_to(PACKAGE.parents[1])
                arrows.append(
                    f"{where}:{line}: {name} (layer {own + 1}) imports {target} "
                    f"(layer {theirs + 1})"
                )
    return arrows


def test_every_module_has_a_layer():
    order = layer_order()
    unplaced = [
        name for name in module_names() if name != "pretrain" and layer_of(name, order) is None
    ]
    assert not unplaced, (
        f"modules in no layer: {unplaced}; add each to the numbered list under '## Layers' in "
        f"{README.relative_to(PACKAGE.parents[1])} (the lowest layer that holds all it imports)"
    )


def test_layers_name_modules_that_exist():
    known = module_names()
    missing = [
        entry
        for names in layer_order()
        for entry in names
        if not any(fnmatchcase(name, f"pretrain.{entry}") for name in known)
    ]
    assert not missing, f"{README}: the layer list names modules that do not exist: {missing}"


def test_no_import_runs_back_up():
    arrows = back_arrows(layer_order())
    assert not arrows, "imports from a higher layer:\n" + "\n".join(arrows)


def test_a_back_arrow_is_seen():
    """The check itself: with the order turned upside down, every import of pretrain.errors
    runs back up (a check that cannot fail checks nothing)."""
    reversed_order = list(reversed(layer_order()))
    assert any("imports pretrain.errors" in arrow for arrow in back_arrows(reversed_order))
