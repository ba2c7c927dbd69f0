"""Lightning's private internals behind one door (issue 52 item 3): no module of src/pretrain
but `pretrain.lightning_compat` imports a private name of Lightning, reads or writes a private
attribute of a Lightning object (the trainer, its loops, strategy, callbacks, loggers...), or
calls a private method of a Lightning base class through `super()`. The compat module's
functions are each pinned by tests/integration/test_lightning_compat.py."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "src" / "pretrain"
DOOR = PACKAGE / "lightning_compat.py"
# names of Lightning objects as the code calls them: a private attribute read on a chain
# through one of these is Lightning's (`trainer.fit_loop._should_accumulate()`)
LIGHTNING_OBJECTS = {
    "trainer",
    "_trainer",
    "fit_loop",
    "epoch_loop",
    "batch_progress",
    "strategy",
    "launcher",
    "accelerator",
    "precision_plugin",
    "callback",
    "checkpoint_callback",
    "logger",
    "loggers",
    "lightning_module",
}


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def chain_names(node: ast.expr) -> list[str]:
    """The names along an attribute chain, `a.b.c` -> [a, b, c] (calls and subscripts
    looked through)."""
    names = []
    while True:
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call | ast.Subscript):
            node = node.func if isinstance(node, ast.Call) else node.value
        elif isinstance(node, ast.Name):
            return [node.id, *reversed(names)]
        else:
            return list(reversed(names))


def private_uses(source: str, filename: str = "<test>") -> list[tuple[int, str]]:
    """(line, what) of every use of a Lightning private in `source`."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lightning":
            parts = (node.module or "").split(".") + [a.name for a in node.names]
            found += [(node.lineno, f"import {node.module}.{p}") for p in parts if is_private(p)]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "lightning" and any(is_private(p) for p in parts):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            value = node.value
            through_super = (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id == "super"
            )
            if through_super or LIGHTNING_OBJECTS & set(chain_names(value)):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_scan_finds_the_patterns_it_guards_against():
    source = (
        "from lightning.pytorch.loops.fit_loop import _FitLoop\n"
        "from lightning.fabric.connector import _convert_precision_to_unified_args\n"
        "a = trainer.fit_loop._should_accumulate()\n"
        "b = trainer._logger_connector.should_update_logs\n"
        "c = self.trainer.fit_loop.epoch_loop.batch_progress.current._x\n"
        "d = super()._configure_launcher()\n"
        "e = self._own_attribute + task._loss_scale + watchdog._trainer\n"
    )
    lines = sorted(line for line, _ in private_uses(source))
    assert lines == [1, 2, 3, 4, 5, 6]  # our own objects' attributes (line 7) are ours
    assert not private_uses("x = self._own + task._loss_scale + module.__class__\n")


def test_only_lightning_compat_touches_lightning_privates():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == DOOR:
            continue
        for line, what in private_uses(path.read_text(), str(path)):
            offenders.append(f"{path.relative_to(PACKAGE.parents[1])}:{line}: {what}")
    assert not offenders, (
        "Lightning private used outside src/pretrain/lightning_compat.py (add a named function "
        "there, pinned in tests/integration/test_lightning_compat.py):\n" + "\n".join(offenders)
    )
