"""The house's shape: imports run one way (server -> protocols -> engine), engine's rooms only
import rooms below them, and no module imports itself back through any chain (imports inside
functions and under TYPE_CHECKING count too: a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("server", "protocols", "engine")
# engine's rooms from the bottom up: a room may import its own modules and those of rooms
# before it. "engine" is the shared vocabulary (types, errors, validation) at the top level.
ROOM_ORDER = ("engine", "gguf", "text", "tools", "model", "encoder", "rows", "speculation", "batch", "host")
PACKAGE_ORDER = ("engine", "protocols", "server")
NAMESPACE = "mlx_serve."  # installed as mlx_serve.server, mlx_serve.protocols, mlx_serve.engine


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `path` imports, wherever in the file the import stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            name = name.removeprefix(NAMESPACE)
            if name in known:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(path, known) - {name} for name, path in known.items()}


def room_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "engine":
        return parts[0]
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ROOM_ORDER) else "engine"


def test_house_has_no_import_loop() -> None:
    g = graph()
    state: dict[str, int] = {}
    loops: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                loops.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    # A package's __init__ importing its own children is not a loop users can trip on, but we
    # have none, so every chain counts.
    assert loops == [], "import loops: " + "; ".join(" -> ".join(loop) for loop in loops)


def test_house_packages_import_one_way() -> None:
    wrong = [
        f"{src} -> {dst}"
        for src, dsts in graph().items()
        for dst in dsts
        if PACKAGE_ORDER.index(dst.split(".")[0]) > PACKAGE_ORDER.index(src.split(".")[0])
    ]
    assert wrong == [], "imports against server -> protocols -> engine: " + ", ".join(sorted(wrong))


def test_house_engine_rooms_import_only_rooms_below() -> None:
    g = graph()
    engine_modules = [m for m in g if m.split(".")[0] == "engine"]
    assert {room_of(m) for m in engine_modules} == set(ROOM_ORDER), "a room is missing from ROOM_ORDER"
    wrong = [
        f"{src} ({room_of(src)}) -> {dst} ({room_of(dst)})"
        for src in engine_modules
        for dst in g[src]
        if ROOM_ORDER.index(room_of(dst)) > ROOM_ORDER.index(room_of(src))
    ]
    assert wrong == [], "engine rooms importing a room above them: " + ", ".join(sorted(wrong))


def test_house_engine_top_level_is_only_the_vocabulary() -> None:
    top = sorted(p.stem for p in (ROOT / "engine").glob("*.py"))
    assert top == ["__init__", "errors", "types", "validation"]


def test_house_each_room_says_what_it_owns_and_may_import() -> None:
    for room in ROOM_ORDER[1:]:
        doc = ast.get_docstring(ast.parse((ROOT / "engine" / room / "__init__.py").read_text()))
        assert doc is not None and "May import" in doc, f"engine/{room}/__init__.py"


def test_house_imports_name_the_installed_namespace() -> None:
    """Every import of the project names it under mlx_serve (what a wheel installs): a bare
    `import server` would work only in a source checkout, and load a second copy of the module."""
    bare: list[str] = []
    for folder in (*PACKAGES, "tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                bare += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in PACKAGES]
    assert bare == [], "imports outside the mlx_serve namespace: " + ", ".join(bare)


def test_house_namespace_links_the_folders() -> None:
    """mlx_serve/ holds the three folders (as links): the repository keeps its layout."""
    for pkg in PACKAGES:
        link = ROOT / "mlx_serve" / pkg
        assert link.is_symlink() and link.resolve() == (ROOT / pkg).resolve(), link
