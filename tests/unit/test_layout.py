"""The shape of the package, as docs/architecture.md draws it: no import circles among modules; folders (and the
top-level modules) in layers, each importing only its own and lower layers; every module named in the map; no long
function in planner/ or probe/. Every import counts, also those inside functions (they hide a dependency, they do
not remove it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = "tune_advisor"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAX_FUNCTION_LINES = 60
SHORT_FUNCTIONS = ("planner", "probe")  # the folders held to MAX_FUNCTION_LINES


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> dict[str, int]:
    """The package's own modules that `path` imports anywhere in it, each with the line of its first import.
    `from package import name` is the submodule `name` where there is one, else the package itself."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            root = ".".join([*base, *([node.module] if node.module else [])])
            targets = [f"{root}.{a.name}" if f"{root}.{a.name}" in known else root for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.setdefault(target, node.lineno)
    return found


def cycles() -> list[list[str]]:
    paths = modules()
    graph = {name: set(imports(path, set(paths))) for name, path in paths.items()}
    # A package's __init__ importing its own submodules is how Python loads it, not a circle.
    graph = {name: {t for t in targets if not t.startswith(name + ".")} for name, targets in graph.items()}
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                found.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target, [*stack, target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


# --- layers -------------------------------------------------------------------------------------------------


def unit(module: str) -> str | None:
    """A module's place in the layers: its folder (`probe/`), or itself at the top (`knobs.py`). None for the
    package's own __init__ (its version, and the API it hands out lazily), which stands outside them."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return parts[1] + "/" if (SRC / PACKAGE / parts[1]).is_dir() else parts[1] + ".py"


def layers(text: str) -> dict[str, int]:
    """The layers as docs/architecture.md lists them under "## Layers", lowest first: lines `N. `unit` `unit` …`."""
    found = re.search(r"^## Layers.*?$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    section = found.group(1) if found else ""
    placed: dict[str, int] = {}
    for number, rest in re.findall(r"^(\d+)\. (.*)$", section, flags=re.M):
        for name in re.findall(r"`([\w.]+/?)`", rest.split(":")[0]):
            placed[name] = int(number)
    return placed


def layer_breaches(placed: dict[str, int]) -> list[str]:
    """Each import of a module into a higher layer than its own, or into another unit of its own layer."""
    paths = modules()
    breaches = []
    for name, path in paths.items():
        here = unit(name)
        for target, line in sorted(imports(path, set(paths)).items()):
            there = unit(target)
            if here is None or there is None or there == here or here not in placed or there not in placed:
                continue
            if placed[there] >= placed[here]:
                breaches.append(f"{path.relative_to(SRC)}:{line} imports {target} ({here} is layer {placed[here]}, "
                                f"{there} layer {placed[there]})")
    return breaches


def unplaced(placed: dict[str, int]) -> list[str]:
    return sorted({u for u in map(unit, modules()) if u is not None} - set(placed))


def unnamed(text: str) -> list[str]:
    """Modules docs/architecture.md does not name: a folder's `__init__.py` by the folder (`probe/`), any other
    module by its path under the package (`probe/runner.py`, `knobs.py`), or by its name (`runner.py`) in the
    module index's row of its folder (a row beginning with the folder; `tune_advisor/` for the top level)."""
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+/)` \|(.*)$", text, flags=re.M)}
    missing = []
    for path in modules().values():
        relative = path.relative_to(SRC / PACKAGE)
        if relative == Path("__init__.py"):
            continue
        folder = f"{relative.parent.as_posix()}/" if relative.parent != Path(".") else ""
        if path.name == "__init__.py":
            named = f"`{folder}" in text
        else:
            named = (re.search(rf"(?<![\w/]){re.escape(folder + path.name)}", text) is not None
                     or f"`{path.name}`" in rows.get(folder or f"{PACKAGE}/", ""))
        if not named:
            missing.append(relative.as_posix())
    return sorted(missing)


def long_functions(folders=SHORT_FUNCTIONS, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    found = []
    for folder in folders:
        for path in sorted((SRC / PACKAGE / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > limit:
                        found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} {lines} lines")
    return found


# --- the checkers see what they must -----------------------------------------------------------------------


def fake_package(tmp_path, monkeypatch, files: dict[str, str]) -> None:
    for name, source in {"__init__.py": "", **files}.items():
        path = tmp_path / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    monkeypatch.setitem(globals(), "SRC", tmp_path)


def test_the_checker_sees_a_circle_hidden_inside_a_function(tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, {"a.py": "from . import b\n", "b.py": "def f():\n    from .a import x\n"})
    assert cycles() == [["tune_advisor.a", "tune_advisor.b", "tune_advisor.a"]]


def test_the_layer_checker_names_an_upward_import_inside_a_function_and_a_sideways_one(tmp_path, monkeypatch):
    # GIVEN low/ under high/, and side/ beside high/: low imports high inside a function, side imports high
    fake_package(tmp_path, monkeypatch, {
        "low/__init__.py": "", "low/a.py": "def f():\n    from ..high import b\n",
        "high/__init__.py": "", "high/b.py": "from ..low import a\n",
        "side/__init__.py": "", "side/c.py": "from ..high.b import x\n"})
    placed = layers("## Layers\n1. `low/`\n2. `high/` `side/`: beside each other\n")
    # THEN both are named, with their lines; high importing low is fine
    assert layer_breaches(placed) == [
        "tune_advisor/low/a.py:2 imports tune_advisor.high.b (low/ is layer 1, high/ layer 2)",
        "tune_advisor/side/c.py:1 imports tune_advisor.high.b (side/ is layer 2, high/ layer 2)"]
    assert unplaced({"low/": 1}) == ["high/", "side/"]


def test_the_map_checker_accepts_a_path_or_a_name_in_its_folders_row(tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, {"top.py": "", "low/__init__.py": "", "low/a.py": "", "low/b.py": "",
                                         "low/c.py": ""})
    text = "`top.py`; `low/a.py`\n| `low/` | `b.py` does b |\n"
    assert unnamed(text) == ["low/c.py"]


def test_the_length_checker_counts_a_function_from_its_def_to_its_last_line(tmp_path, monkeypatch):
    def source(name: str, lines: int) -> str:
        return f"def {name}():\n" + "".join(f"    x = {i}\n" for i in range(lines - 1))

    # GIVEN a function of 61 lines and one of 60
    fake_package(tmp_path, monkeypatch, {"probe/__init__.py": "",
                                         "probe/m.py": source("long", 61) + source("short", 60)})
    assert long_functions() == ["tune_advisor/probe/m.py:1 long 61 lines"]


# --- the package -----------------------------------------------------------------------------------------------


def test_src_has_no_import_circles():
    assert cycles() == []


def test_each_folder_imports_only_its_own_and_lower_layers():
    placed = layers(ARCHITECTURE.read_text(encoding="utf-8"))
    assert unplaced(placed) == [], "not in docs/architecture.md's layers"
    assert layer_breaches(placed) == []


def test_docs_architecture_names_every_module():
    assert unnamed(ARCHITECTURE.read_text(encoding="utf-8")) == []


def test_no_function_in_planner_or_probe_is_longer_than_60_lines():
    assert long_functions() == []
