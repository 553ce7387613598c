"""The package's import graph: no cycles, and no import hidden inside a function except
of the optional extras (which ``import kerastorch`` must not need) and of the package's few
modules whose imports are heavy and which only some runs use (``import kerastorch`` leaves them out).

Read from the source with ``ast``, so a back-edge hidden in a function body is seen too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "kerastorch"
PACKAGE = "kerastorch"

# Imported inside functions on purpose: optional extras, imported only when used.
OPTIONAL_EXTRAS = (
    "matplotlib",
    "lightning",
    "tensorboard",
    "torch.utils.tensorboard",
    "wandb",
    "mlflow",
    "optuna",
    "IPython",
    "sklearn",
    "ray",
)
# Package modules imported inside the functions that use them, on purpose: their own imports are
# heavy and only some runs need them. Each with the modules ``import kerastorch`` must leave out.
LAZY_MODULES = {
    # torch's FSDP2, DTensor and distributed checkpoint: about 0.6 s, needed by FSDP runs only
    "kerastorch.strategies.fsdp_engine": (
        "torch.distributed.fsdp",
        "torch.distributed.tensor",
        "torch.distributed.checkpoint",
    ),
}
# Functions whose own source runs elsewhere, so they must import what they use.
SELF_CONTAINED = {("kerastorch.devices.cuda", "probe_cuda_devices")}  # run in a child process by its source


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def imported_names(node: ast.AST, importer: str, is_package: bool) -> list[str]:
    """The absolute module names an import statement names (a ``from`` import's names may be modules too)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = importer.split(".") if is_package else importer.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def top_level_imports(tree: ast.Module) -> list[ast.AST]:
    """Import statements that run when the module is imported (also inside module-level if/try)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not _inside_function(tree, node):
            found.append(node)
    return found


def _inside_function(tree: ast.Module, target: ast.AST) -> bool:
    return any(
        target in set(ast.walk(fn)) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
    )


def function_imports(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """``(function name, import statement)`` for every import inside a function body."""
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found.append((fn.name, node))
    return found


def import_graph() -> dict[str, set[str]]:
    """Module → the package modules its import runs (a subpackage's ``__init__`` counts when entered from outside)."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        lazy = [node for _, node in function_imports(tree) if imported_names(node, name, is_package)[0] in LAZY_MODULES]
        for node in top_level_imports(tree) + lazy:
            for target in imported_names(node, name, is_package):
                if target not in known or target in (name, PACKAGE):  # every module runs inside the root package
                    continue
                graph[name].add(target)
                parent = target.rsplit(".", 1)[0]
                # Importing kerastorch.training.callback from outside runs kerastorch/callbacks/__init__.py first.
                if parent in known and parent != PACKAGE and not name.startswith(parent + ".") and parent != name:
                    graph[name].add(parent)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a list of modules, or [] when there is none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return []


def test_the_package_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 30 and graph["kerastorch.run"] >= {
        "kerastorch.training.loop",
        "kerastorch.devices.plan",
        "kerastorch.devices.launch",
    }
    cycle = find_cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


# The package's folders, low to high: each imports only folders before it in this list (top-level
# modules are the doors above them all: arguments, model, run, evaluation, settings ...).
LAYERS = ("helpers", "files", "data", "strategies", "devices", "training", "callbacks", "tools", "compat")


def folder_of(module: str) -> str:
    """The folder a module lives in ("training" for kerastorch.training.loop), or "" at the top level."""
    parts = module.split(".")
    is_package = (PACKAGE_DIR / Path(*parts[1:]) / "__init__.py").exists() if len(parts) > 1 else True
    inside = parts[1:] if is_package else parts[1:-1]
    return inside[0] if inside else ""


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a folder to a folder at its level or above it (every folder must be in LAYERS)."""
    found = []
    for importer, targets in graph.items():
        low = folder_of(importer)
        for target in targets:
            high = folder_of(target)
            if low and high and low != high and LAYERS.index(high) > LAYERS.index(low):
                found.append(f"{importer} -> {target}")
    return sorted(found)


def test_the_folders_are_layers_each_importing_only_those_below_it():
    graph = import_graph()
    folders = {folder_of(name) for name in graph} - {""}
    assert folders == set(LAYERS), f"a folder is missing from LAYERS, or LAYERS names one gone: {folders ^ set(LAYERS)}"
    assert upward_imports(graph) == []


def test_a_planted_upward_import_is_found():
    graph = import_graph()
    graph["kerastorch.data.batches"].add("kerastorch.training.loop")
    assert upward_imports(graph) == ["kerastorch.data.batches -> kerastorch.training.loop"]


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = import_graph()
    graph["kerastorch.data.batches"].add("kerastorch.run")  # run imports loop, which imports batches
    assert "kerastorch.data.batches" in find_cycle(graph)


def hidden_imports(name: str, source: str, is_package: bool = False) -> list[str]:
    """Imports inside function bodies of a module's source that are not optional extras."""
    hidden = []
    for function, node in function_imports(ast.parse(source)):
        if (name, function) in SELF_CONTAINED:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            targets = imported_names(node, name, is_package)[:1]
        for target in targets:
            if target in LAZY_MODULES:
                continue
            if not any(target == extra or target.startswith(extra + ".") for extra in OPTIONAL_EXTRAS):
                hidden.append(f"line {node.lineno} in {function}(): {target}")
    return hidden


def test_no_import_inside_a_function_except_optional_extras():
    hidden = [
        f"{path.relative_to(PACKAGE_DIR.parent)} {found}"
        for name, path in modules().items()
        for found in hidden_imports(name, path.read_text(), path.name == "__init__.py")
    ]
    assert not hidden, "imports inside functions (move them to the top of the module):\n" + "\n".join(hidden)


def test_a_planted_function_local_import_is_found():
    source = "def plot():\n    import matplotlib\n\ndef run():\n    from .model import KerasModel\n"
    assert hidden_imports("kerastorch.loop", source) == ["line 5 in run(): kerastorch.model"]


def test_import_kerastorch_leaves_the_heavy_modules_out():
    """A run that does not use them never pays for their import (a fresh interpreter: this one's
    tests may have imported them)."""
    heavy = [module for modules in LAZY_MODULES.values() for module in modules] + list(LAZY_MODULES)
    script = f"import sys, kerastorch; print([m for m in {heavy!r} if m in sys.modules])"
    imported = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert imported.strip() == "[]", f"import kerastorch imported {imported.strip()}"
