"""Moving the service's state between recovery stores (``tsi state export`` / ``import``).

Bytewax ties a recovery store to the cluster that initialised it (its partitions, its
processes); the bandits' state and the input positions are not tied to it. To run with
another number of processes or workers: stop the service cleanly, export the state of
every process's recovery directory into one file, import the file into the new, empty
directories, and start. Each shard starts from its seed and each input partition from
the position the old store had committed, so no feedback is lost or applied twice.

The file is a sequence of records (``flows.service.shard_store.encode``): a header (the
format, the input positions, the number of instances), then the instances' entries.
It is a pickle, like the store it comes from: import only files you made.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.service.logic import shard_of
from flows.service.recovery import (
    INPUTS_SEED,
    PARTITION_FILE,
    committed_entries,
    committed_inputs,
    shard_store,
)
from flows.service.resting import Entry
from flows.service.shard_store import encode, read_payloads, write_seed

FORMAT = "tsi.state"
VERSION = 1
CHUNK = 10_000  # entries per record


class StateFileError(ValueError):
    """A state file or a target directory that cannot be used, and why."""


@dataclass(frozen=True)
class Moved:
    """What an export wrote or an import read."""

    instances: int
    input_partitions: int


def export_state(recovery_dirs: Iterable[Path], path: Path, flow_id: str = "tsi") -> Moved:
    """Write the committed state of the recovery directories (one per process of a
    cluster) to ``path``."""
    entries: dict[str, Entry] = {}
    inputs: dict[str, Any] = {}
    for directory in recovery_dirs:
        entries.update(committed_entries(directory, flow_id))
        inputs.update(committed_inputs(directory, flow_id))
    header = {"format": FORMAT, "version": VERSION, "inputs": inputs, "instances": len(entries)}
    held = list(entries.values())
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as file:
        file.write(encode([header]))
        for start in range(0, len(held), CHUNK):
            file.write(encode(held[start : start + CHUNK]))
    partial.replace(path)
    return Moved(len(entries), len(inputs))


def read_state_file(path: Path) -> tuple[dict[str, Any], list[Entry]]:
    """(header, entries) of an exported file; ``StateFileError`` if it is not one whole."""
    try:
        payloads, _, problem = read_payloads(path)
    except OSError as exc:
        raise StateFileError(f"cannot read {path}: {exc}") from None
    header = payloads[0][0] if payloads and payloads[0] else None
    if problem is not None or not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StateFileError(f"{path} is not a whole tsi state file ({problem or 'no header'})")
    if header.get("version") != VERSION:
        raise StateFileError(f"{path} is version {header.get('version')}, this tsi reads 1")
    entries = [entry for payload in payloads[1:] for entry in payload]
    if len(entries) != header["instances"]:
        raise StateFileError(f"{path} holds {len(entries)} of {header['instances']} instances")
    return header, entries


def import_state(path: Path, recovery_dirs: Iterable[Path]) -> Moved:
    """Seed each new recovery directory (one per process of the new cluster) with the
    state ``path`` holds: every shard's seed in each (a shard is read by the process that
    serves it), and the input positions."""
    header, entries = read_state_file(path)
    by_shard: dict[str, list[Entry]] = {}
    for entry in entries:
        by_shard.setdefault(shard_of(entry.key), []).append(entry)
    directories = list(recovery_dirs)
    for directory in directories:
        _check_new(directory)
    for directory in directories:
        store = shard_store(directory)
        for shard, held in by_shard.items():
            write_seed(store, shard, held)
        seed = store / INPUTS_SEED
        seed.with_suffix(".partial").write_bytes(encode([header["inputs"]]))
        seed.with_suffix(".partial").replace(seed)
    return Moved(len(entries), len(header["inputs"]))


def _check_new(directory: Path) -> None:
    """A directory to import into must be new: no Bytewax partition, no shard log."""
    if not directory.exists():
        return
    used = [p.name for p in directory.iterdir() if PARTITION_FILE.fullmatch(p.name)]
    store = shard_store(directory)
    if store.exists():
        used += [f"{store.name}/{p.name}" for p in store.iterdir()]
    if used:
        raise StateFileError(
            f"recovery directory {directory} is in use ({', '.join(sorted(used)[:3])}): "
            "import into new, empty directories"
        )
