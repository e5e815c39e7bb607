"""The package's layers (docs/architecture.md): a lower layer never imports a higher one, and
the recording layer, which runs inside the training job, loads the standard library only.

Two checks. Statically, every ``goodtrace`` import in every module (at module level or inside
a function) must name a layer the importing layer may use. Dynamically, each layer imported
alone in a fresh interpreter must leave no higher layer and no heavy module in ``sys.modules``.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import goodtrace

PACKAGE = Path(goodtrace.__file__).parent

# Layer of each top-level part of the package, and the parts each layer may import.
LAYER_OF = {
    "schema": "leaf",
    "accelerators": "leaf",
    "record": "record",
    "read": "read",
    "columns": "read",  # numpy column helpers of the reader and the analysis (numpy imported lazily)
    "analysis": "analysis",
    "renderers": "renderers",
    "sinks": "sinks",
    "integrations": "integrations",
    "testing": "testing",
    "demo": "demo",
    "cli": "cli",
    "__main__": "cli",
}
MAY_IMPORT = {
    "leaf": {"leaf"},
    "record": {"leaf", "record"},
    "read": {"leaf", "record", "read"},
    "analysis": {"leaf", "record", "read", "analysis"},
    "renderers": {"leaf", "record", "read", "analysis", "renderers"},
    "sinks": {"leaf", "record", "read", "analysis", "renderers", "sinks"},
    "integrations": {"leaf", "record", "integrations", "facade"},
    "testing": {"leaf", "record", "read", "facade"},
    "demo": {"leaf", "record", "integrations", "demo", "facade"},
    "cli": set(LAYER_OF.values()) | {"facade"},
}
# Modules a layer loads by name (a "module:attribute" string resolved at run time) are imports
# like any other: the static check reads those strings too. Where one goes up the layers it must
# be declared here, with the module that loads it. The recording layer's sink table names the
# built-in sinks (record/live/sink_hub.py BUILTIN_SINKS): when a job names one, its module is
# imported on first use, and at finish() it reads the run back with read/ and analysis/ on the
# sink's own thread, inside the job. Nothing else in the recording layer may load a higher layer.
# The recorder starts the rank's own compactor (record/io/compactor.py, when a job asks for it)
# as ``python -m goodtrace.read.rank_compact``: a process of its own, never an import into the job.
LOADED_BY_NAME = {"goodtrace.record.live.sink_hub": {"sinks"}, "goodtrace.record.io.compactor": {"read"}}
# What each layer, imported alone, must not load (its own lazy imports run only when used).
HEAVY = ("torch", "jax", "numpy", "duckdb", "rich", "fsspec", "tensorboard", "tensorboardX", "wandb", "mlflow",
         "prometheus_client", "transformers", "lightning")
ALONE = {
    "record": (["goodtrace", "goodtrace.record"], HEAVY),
    "read": (["goodtrace.read"], ("torch", "jax", "numpy", "duckdb", "rich")),
    "analysis": (["goodtrace.analysis"], ("torch", "jax", "numpy", "duckdb", "rich")),
    "renderers": (["goodtrace.renderers"], ("torch", "jax", "numpy", "duckdb")),
}
HIGHER = {
    "record": ("read", "analysis", "renderers", "sinks", "integrations", "cli", "demo", "testing"),
    "read": ("analysis", "renderers", "sinks", "integrations", "cli", "demo", "testing"),
    "analysis": ("renderers", "sinks", "integrations", "cli", "demo", "testing"),
    "renderers": ("sinks", "integrations", "cli", "demo", "testing"),
}


def _layer_of_module(module: str) -> str:
    """``goodtrace.read.load`` -> "read"; the package itself is the public facade."""
    parts = module.split(".")
    if parts[0] != "goodtrace":
        raise ValueError(module)
    if len(parts) == 1:
        return "facade"
    if parts[1] not in LAYER_OF:
        raise AssertionError(f"{module}: goodtrace.{parts[1]} belongs to no layer; add it to LAYER_OF")
    return LAYER_OF[parts[1]]


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every ``goodtrace`` module the file imports, wherever the import statement sits."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "goodtrace"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "goodtrace":
                continue
            if node.module == "goodtrace":  # from goodtrace import schema / from goodtrace import x
                found += [(node.lineno, f"goodtrace.{a.name}" if a.name in LAYER_OF else "goodtrace")
                          for a in node.names]
            else:
                found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith("goodtrace")
        ):
            found.append((node.lineno, node.args[0].value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and BY_NAME.fullmatch(node.value):
            found.append((node.lineno, node.value.partition(":")[0]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _is_module(node.value):
            found.append((node.lineno, node.value))  # a module run by name: python -m goodtrace.read.x
    return found


BY_NAME = re.compile(r"goodtrace(\.\w+)+:\w+(\.\w+)*")
MODULE_NAME = re.compile(r"goodtrace(\.\w+)+")


def _is_module(text: str) -> bool:
    """Whether ``text`` names one of goodtrace's modules (a string a process is started with)."""
    if not MODULE_NAME.fullmatch(text):
        return False
    path = PACKAGE.parent.joinpath(*text.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()  # "goodtrace.sinks.wandb:WandbSink.from_spec"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def _declared(module: str, target: str) -> bool:
    """A load by name that the module may do beyond its layer's imports (LOADED_BY_NAME)."""
    return _layer_of_module(target) in LOADED_BY_NAME.get(module, set())


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def test_every_import_goes_down_the_layers() -> None:
    wrong = []
    for path in _modules():
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        own = _layer_of_module(".".join(relative.parts).removesuffix(".__init__"))
        for line, target in _imports(path):
            layer = _layer_of_module(target)
            if layer not in MAY_IMPORT[own] and not _declared(_module_name(path), target):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {own} imports {target} ({layer})")
    assert not wrong, "imports against the layer rule:\n" + "\n".join(wrong)


def test_the_recording_layer_imports_nothing_outside_itself_and_the_schema() -> None:
    for path in sorted((PACKAGE / "record").rglob("*.py")):
        for line, target in _imports(path):
            assert (target == "goodtrace.schema" or target.startswith("goodtrace.record")
                    or _declared(_module_name(path), target)), f"{path}:{line}: {target}"


def test_the_sinks_the_recording_layer_loads_by_name_are_seen_and_exist() -> None:
    """The sink table's strings are what the static check reads as the recording layer's loads
    of the sinks layer (the declared exception), and each names a module and class that exist."""
    from goodtrace.record.live.sink_hub import BUILTIN_SINKS

    loads = {target for _, target in _imports(PACKAGE / "record" / "live" / "sink_hub.py")}
    for name, target in BUILTIN_SINKS.items():
        module, _, attribute = target.partition(":")
        assert module in loads, f"the layer test does not see sink {name!r} ({target})"
        assert _layer_of_module(module) == "sinks"
        path = PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")
        assert path.is_file(), f"sink {name!r}: {path} does not exist"
        classes = {n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.ClassDef)}
        assert attribute.split(".")[0] in classes, f"sink {name!r}: {module} has no {attribute.split('.')[0]}"


def test_no_import_circles_between_modules() -> None:
    """Module-level imports between goodtrace modules form no cycle (lazy imports inside
    functions are allowed to point down only, which the layer test checks)."""
    graph: dict[str, set[str]] = {}
    names = {}
    for path in _modules():
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        names[name] = path
    for name, path in names.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges: set[str] = set()
        for node in tree.body:  # module level only
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            edges.update(t for t in targets if t in names and t != name)
        graph[name] = edges
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, stack: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend([*stack[stack.index(nxt):], node, nxt] if nxt in stack else [node, nxt])
                return True
            if state.get(nxt) is None and visit(nxt, [*stack, node]):
                return True
        state[node] = 2
        return False

    for node in sorted(graph):
        if state.get(node) is None and visit(node, []):
            break
    assert not cycle, "import circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("layer", sorted(ALONE))
@pytest.mark.processes
def test_each_layer_alone_loads_no_higher_layer_and_no_heavy_module(layer: str) -> None:
    modules, heavy = ALONE[layer]
    # Every module of the layer, not just its package (its __init__ may import little).
    if layer != "record":
        modules = modules + sorted(
            ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
            for p in (PACKAGE / layer).rglob("*.py")
        )
    else:
        modules = modules + [
            ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
            for p in sorted((PACKAGE / "record").rglob("*.py"))
            if p.stem not in ("torch_values", "jax_values", "jax_compile")  # framework adapters
        ]
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    too_high = sorted(m for m in loaded if m.split(".")[0] == "goodtrace" and len(m.split(".")) > 1
                      and m.split(".")[1] in HIGHER[layer])
    assert not too_high, f"importing the {layer} layer loaded {too_high}"
    heavy_loaded = sorted(m for m in heavy if m in loaded)
    assert not heavy_loaded, f"importing the {layer} layer loaded {heavy_loaded}"
