"""``flows/`` uses only Bytewax's public names: Bytewax 0.21.1 is its last release, and a
private name (``_KafkaSourcePartition``, ``operators._kafka_error_split``) may change in any
fork or upgrade without notice. Each import from ``bytewax`` is read with ``ast``: no
``_``-prefixed module or imported name, and no ``_``-prefixed attribute of a name bound
to a Bytewax module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of every private Bytewax name ``source`` imports or reads.

    >>> private_uses("from bytewax.connectors.kafka import KafkaSource, _KafkaSourcePartition")
    [(1, 'bytewax.connectors.kafka._KafkaSourcePartition')]
    >>> private_uses("from bytewax.connectors.kafka import operators as kop\\nkop._split")
    [(2, 'kop._split')]
    >>> private_uses("from bytewax.inputs import StatefulSourcePartition\\nx._y")
    []
    """
    tree = ast.parse(source)
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bytewax"):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                if _private(name):
                    found.append((node.lineno, name))
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("bytewax"):
                    if _private(alias.name):
                        found.append((node.lineno, alias.name))
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            owner = ast.unparse(node.value)
            if owner in modules or owner.split(".")[0] in modules:
                found.append((node.lineno, f"{owner}.{node.attr}"))
    return sorted(found)


def test_flows_uses_no_private_bytewax_name():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sorted((ROOT / "flows").rglob("*.py"))
        for line, name in private_uses(path.read_text())
    ]
    assert offenders == [], "private Bytewax names used:\n" + "\n".join(offenders)
