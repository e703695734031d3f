"""The house's shape, read from the source: the rooms of ``flows/service`` import one way
(ARCHITECTURE.md, "Layers"), modules import in no circle, functions stay short and
switches on an exact type stay few.

Imports are read from every module: a ``.py`` file's syntax tree (imports inside
functions included), a compiled module's (``.pyx``, ``.pxd``) ``import`` and ``cimport``
lines.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICE = ROOT / "flows" / "service"
#: the rooms of flows/service, lowest first: a room imports only from rooms before it
LAYERS = ("wire", "instances", "observe", "shards", "dataflow", "connectors", "runtime", "main")
#: the product's code, outside tests/
PRODUCT = ("flows", "tsi_core", "arena", "deploy", "bench")
MAX_LINES = 60
MAX_TYPE_SWITCHES = 20  # fewer than this many ``type(...) is`` in .py and .pyx files

_COMPILED_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\b|c?import\s+([\w.]+))")
_TYPE_IS = re.compile(r"\btype\((?:[^()]|\([^()]*\))*\)\s+is\b")
_COMPILED_DEF = re.compile(r"^( *)(?:c?p?def)\s+(?!class\b)(?:[\w\[\], *.]+\s+)?\**(\w+)\s*\(")


def module_name(path: Path) -> str:
    """The dotted name of a module file under ROOT."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in ``path``: ``from a import b`` gives ``a.b``
    (``b`` may be a module), relative imports made absolute."""
    text = path.read_text()
    if path.suffix != ".py":
        for number, line in enumerate(text.splitlines(), 1):
            found = _COMPILED_IMPORT.match(line)
            if found:
                yield number, found.group(1) or found.group(2)
        return
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def service_files() -> list[Path]:
    return sorted(p for p in SERVICE.rglob("*") if p.suffix in (".py", ".pyx", ".pxd"))


def room(module: str) -> str | None:
    """The room of flows/service a module is in (a folder, or a top-level module), or
    None outside them."""
    parts = module.split(".")
    if parts[:2] != ["flows", "service"] or len(parts) < 3 or parts[2] not in LAYERS:
        return None
    return parts[2]


def room_imports() -> list[tuple[str, str, str]]:
    """(from room, to room, where) of every import between two rooms."""
    found = []
    for path in service_files():
        here = room(module_name(path))
        for line, name in imports(path):
            there = room(name)
            if here is not None and there is not None and there != here:
                found.append((here, there, f"{path.relative_to(ROOT)}:{line} imports {name}"))
    return found


def cycle(edges: dict[str, dict[str, str]]) -> list[str] | None:
    """The imports of one circle in a graph of ``edges[a][b] = where``, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            circle = [*path[path.index(node) :], node]
            return [edges[a][b] for a, b in itertools.pairwise(circle)]
        if node in done:
            return None
        for nxt in edges.get(node, {}):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in list(edges):
        found = visit(start, [])
        if found:
            return found
    return None


def test_cycle_finds_a_circle_and_names_its_imports():
    edges = {"a": {"b": "a imports b"}, "b": {"c": "b imports c"}, "c": {"a": "c imports a"}}
    assert cycle(edges) == ["a imports b", "b imports c", "c imports a"]
    assert cycle({"a": {"b": "x"}, "b": {}}) is None


def test_a_compiled_function_ends_where_its_indentation_does(tmp_path):
    module = tmp_path / "m.pyx"
    module.write_text(
        "cdef int f(int a,\n          int b):\n    return a\n\n    # c\ncdef int x = 1\n"
    )
    assert list(compiled_functions(module)) == [(1, "f", 3)]


def test_imports_are_read_inside_functions_and_from_compiled_modules():
    parse = SERVICE / "wire" / "_parse.pyx"
    assert any(name.startswith("flows.service.wire._records") for _, name in imports(parse))
    lazy = SERVICE / "runtime" / "startup.py"
    tree = ast.parse(lazy.read_text())
    nested = {
        n.lineno
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef)
        for n in ast.walk(f)
        if isinstance(n, ast.ImportFrom | ast.Import)
    }
    assert nested <= {line for line, _ in imports(lazy)}


def test_no_room_imports_a_higher_one():
    upward = [
        where for here, there, where in room_imports() if LAYERS.index(there) > LAYERS.index(here)
    ]
    assert not upward, "imports from a lower room to a higher one:\n" + "\n".join(upward)


def test_rooms_import_in_no_circle():
    edges: dict[str, dict[str, str]] = {}
    for here, there, where in room_imports():
        edges.setdefault(here, {}).setdefault(there, where)
    found = cycle(edges)
    assert found is None, "rooms that import each other:\n" + "\n".join(found or [])


def test_modules_import_in_no_circle():
    known = {module_name(p): p for p in service_files() if p.suffix != ".pxd"}
    edges: dict[str, dict[str, str]] = {}
    for name, path in known.items():
        for line, imported in imports(path):
            target = imported if imported in known else imported.rpartition(".")[0]
            if target in known and target != name:
                where = f"{path.relative_to(ROOT)}:{line} imports {imported}"
                edges.setdefault(name, {}).setdefault(target, where)
    found = cycle(edges)
    assert found is None, "modules that import each other:\n" + "\n".join(found or [])


def product_files(*suffixes: str) -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*") if p.suffix in suffixes)


def compiled_functions(path: Path) -> Iterator[tuple[int, str, int]]:
    """(line, name, lines) of each function of a compiled module: from its ``def`` to its
    last line indented deeper (a ``cdef`` variable is no function: it has no brackets)."""
    lines = path.read_text().splitlines()
    for start, line in enumerate(lines):
        found = _COMPILED_DEF.match(line)
        if not found or not line.rstrip().endswith((":", "(", ",")):
            continue
        indent, end = len(found.group(1)), start
        for number in range(start + 1, len(lines)):
            text = lines[number]
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            if len(text) - len(text.lstrip()) <= indent and not text.lstrip().startswith(")"):
                break
            end = number
        yield start + 1, found.group(2), end - start + 1


def test_no_product_function_is_longer_than_the_limit():
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}"
        for path in product_files(".py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]
    long += [
        f"{path.relative_to(ROOT)}:{line} {name}: {size}"
        for path in product_files(".pyx")
        for line, name, size in compiled_functions(path)
        if size > MAX_LINES
    ]
    assert not long, f"functions over {MAX_LINES} lines:\n" + "\n".join(long)


def test_switches_on_an_exact_type_stay_few():
    found = [
        f"{path.relative_to(ROOT)}:{text[: match.start()].count(chr(10)) + 1}"
        for path in product_files(".py", ".pyx")
        for text in [path.read_text()]
        for match in _TYPE_IS.finditer(text)
    ]
    assert len(found) < MAX_TYPE_SWITCHES, "type(...) is, at:\n" + "\n".join(found)
