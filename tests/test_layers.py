"""Imports run one way (docs/architecture in README.md): envsim -> storage -> training -> lab -> the page.

Every module of the project is parsed (not imported) and every import in it is read, those inside functions
included: a lazy import is still a dependency. Three rules follow from the layers:
- a module imports project modules of its own layer or the layers below it, never above;
- no modules import each other in a circle, directly or through others;
- page code (`lab/pages/`, and `app.py`, the checkout's entry point to it) runs no database query: it imports
  neither `sqlmodel` nor the session.

lab/ itself is in rooms (README, "What is where"): the design loop at its root, at most `LAB_ROOT_MODULES` modules,
and the rest in packages of their own (`jobs/`, `study/`, `archive/`, `engineers/`, `cli/`, `pages/`). The rooms
below the page (`lab.jobs`, `lab.study`, `lab.archive`) import nothing from it.

And no function of those modules runs past `FUNCTION_LINES` lines: one that grows past them is two functions.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("envsim", "storage", "training", "lab")
# The page is the top layer: lab/pages/ (`lab.pages.web` assembles its tabs) and `app.py`, which starts it.
LAYERS = ("envsim", "storage", "training", "lab", "page")
LAB_ROOT_MODULES = 12  # lab/'s own .py files beside its __init__; a package (a room) counts as none of them
BELOW_THE_PAGE = ("lab.jobs", "lab.study", "lab.archive")


def project_modules() -> dict[str, Path]:
    modules = {"app": ROOT / "app.py"}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.relative_to(ROOT).parts:  # Alembic's scripts, loaded by Alembic
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = project_modules()


def layer(module: str) -> str:
    if module == "app" or module == "lab.pages" or module.startswith("lab.pages."):
        return "page"
    return module.split(".")[0]


def imported_names(path: Path, module: str) -> list[tuple[str, int]]:
    """(dotted name, line) for every import in the file: `import a.b` gives a.b, `from a import b` gives a.b
    and a (b may be a module or a name in a)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((base, node.lineno))
            out += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return out


def project_imports(module: str) -> dict[str, int]:
    """The project modules `module` imports, each with the first line that does: `import a.b.c` depends on
    a.b.c (and on the packages a and a.b, whose __init__ runs; those are empty here and left out)."""
    found: dict[str, int] = {}
    for name, line in imported_names(MODULES[module], module):
        if name in MODULES and name != module and name not in PACKAGES:
            found.setdefault(name, line)
    return found


GRAPH = {module: project_imports(module) for module in MODULES}


def test_every_layer_is_a_known_one():
    assert {layer(m) for m in MODULES} <= set(LAYERS)
    assert "lab.jobs.worker" in MODULES and "lab.results" in MODULES and "app" in MODULES and "lab.pages.web" in MODULES
    assert layer("app") == layer("lab.pages.web") == "page"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_its_own_layer_and_those_below(module: str):
    rank = LAYERS.index(layer(module))
    upward = [f"{MODULES[module].relative_to(ROOT)}:{line} imports {name} ({layer(name)})"
              for name, line in GRAPH[module].items() if LAYERS.index(layer(name)) > rank]
    assert not upward, f"{module} is in layer {layer(module)}:\n" + "\n".join(upward)


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_modules_import_each_other_in_a_circle():
    assert cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_circle_through_three_modules():
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) == "page"))
def test_page_code_runs_no_database_query(module: str):
    names = {name for name, _ in imported_names(MODULES[module], module)}
    forbidden = sorted(n for n in names if n == "sqlmodel" or n.startswith("sqlmodel.") or n == "storage.db.session")
    assert not forbidden, f"{module} imports {forbidden}: ask lab/ for the rows instead"


def in_room(module: str, room: str) -> bool:
    return module == room or module.startswith(f"{room}.")


def test_labs_root_holds_at_most_a_dozen_modules():
    root = sorted(p.name for p in (ROOT / "lab").glob("*.py") if p.name != "__init__.py")
    assert len(root) <= LAB_ROOT_MODULES, (
        f"lab/ holds {len(root)} modules at its root ({', '.join(root)}), at most {LAB_ROOT_MODULES}: "
        "put the new one in the room (a package under lab/) it belongs to")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if any(in_room(m, room) for room in BELOW_THE_PAGE)))
def test_jobs_study_and_archive_import_nothing_from_the_page_or_the_command_line(module: str):
    """The page and the command line are the lab's two ways in, above every room they call (`lab.cli` runs the
    worker, experiments and the screens; it is never called back)."""
    found = [f"{MODULES[module].relative_to(ROOT)}:{line} imports {name}"
             for name, line in GRAPH[module].items() if in_room(name, "lab.pages") or in_room(name, "lab.cli")]
    assert not found, f"{module} is below the page and the command line:\n" + "\n".join(found)


def test_the_rooms_below_the_page_are_there():
    assert all(room in MODULES for room in BELOW_THE_PAGE)
    assert {"lab.jobs.worker", "lab.study.experiments", "lab.archive.reading", "lab.cli.runs"} <= set(MODULES)


FUNCTION_LINES = 80


def long_functions(path: Path) -> list[str]:
    """`name:line (N lines)` for each function of the file, nested ones and methods included, longer than
    `FUNCTION_LINES`, counted from its first decorator to its last line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if (lines := node.end_lineno - first + 1) > FUNCTION_LINES:
                found.append(f"{node.name}:{node.lineno} ({lines} lines)")
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_runs_past_80_lines(module: str):
    assert long_functions(MODULES[module]) == [], f"{MODULES[module].relative_to(ROOT)}: split these in two"


def test_the_length_check_counts_a_function_from_its_first_decorator_to_its_end(tmp_path: Path):
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES - 2))
    (tmp_path / "f.py").write_text("@staticmethod\ndef f():\n" + body)  # 80 lines, its decorator counted
    method = textwrap.indent("@staticmethod\n@property\ndef g():\n" + body, "    ")  # 81 lines
    (tmp_path / "g.py").write_text("class C:\n" + method)
    assert long_functions(tmp_path / "f.py") == []
    assert long_functions(tmp_path / "g.py") == ["g:4 (81 lines)"]
