"""The epoch-acknowledged sink base, through its file user (``files.JsonLinesSink``): an
epoch's snapshot returns once every line it wrote is on disk, and a write the system
refuses fails the snapshot (and the flow) instead of being dropped."""

import errno
import os

import orjson
import pytest
from bytewax.testing import run_main

from flows.service.connectors import files
from flows.service.connectors.epoch_sink import EpochAcknowledgedPartition
from flows.service.connectors.files import JsonLinesSink, file_wiring
from flows.service.dataflow import build_flow
from flows.service.instances.registry import Registry

LINES = [("k1", b'{"n":1}'), ("k2", b'{"n":2}')]


def test_a_snapshot_returns_once_every_line_of_the_epoch_is_synced(tmp_path, monkeypatch):
    path = tmp_path / "out.jsonl"
    synced = []  # the file's bytes on disk at each fsync

    def fsync(fd):
        synced.append(path.read_bytes())

    monkeypatch.setattr(files.os, "fsync", fsync)
    part = JsonLinesSink(path).build_part("out", str(path), None)
    part.write_batch([LINES[:1], LINES[1:]])
    assert path.read_bytes() == b""  # sent, not yet acknowledged
    offset = part.snapshot()
    assert synced == [b'{"n":1}\n{"n":2}\n'] and offset == len(synced[0])
    assert part.snapshot() == offset and len(synced) == 1  # nothing new: nothing to sync
    part.close()


def test_a_failed_acknowledgement_fails_the_snapshot_naming_the_file(tmp_path, monkeypatch):
    path = tmp_path / "out.jsonl"

    def fsync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(files.os, "fsync", fsync)
    part = JsonLinesSink(path).build_part("out", str(path), None)
    part.write_batch([LINES])
    with pytest.raises(RuntimeError, match=f"{path}: 2 lines of the epoch not written"):
        part.snapshot()


def test_a_flow_whose_file_sink_cannot_sync_fails(tmp_path, monkeypatch):
    (tmp_path / "rq.jsonl").write_bytes(b'{"experiment": "e", "request_id": "a"}\n')
    (tmp_path / "fb.jsonl").write_bytes(b"")

    def fsync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(files.os, "fsync", fsync)
    registry = Registry.from_toml('[experiments.e]\narms = ["a", "b"]\n')
    wiring = file_wiring(*(tmp_path / n for n in ("rq.jsonl", "fb.jsonl", "sel.jsonl", "d.jsonl")))
    with pytest.raises(Exception, match="error snapshotting") as failed:
        run_main(build_flow(registry, wiring))
    causes, cause = [], failed.value
    while cause is not None:
        causes.append(str(cause))
        cause = cause.__cause__
    assert any("lines of the epoch not written to disk" in c for c in causes), causes


def test_a_resumed_file_loses_what_epochs_not_committed_wrote(tmp_path):
    path = tmp_path / "out.jsonl"
    part = JsonLinesSink(path).build_part("out", str(path), None)
    part.write_batch([LINES[:1]])
    committed = part.snapshot()
    part.write_batch([LINES[1:]])
    part.close()  # the last epoch's line is written, but its epoch was never committed
    assert len(path.read_bytes().splitlines()) == 2
    again = JsonLinesSink(path).build_part("out", str(path), committed)
    again.write_batch([[("k3", b'{"n":3}')]])
    again.close()
    assert [orjson.loads(line)["n"] for line in path.read_bytes().splitlines()] == [1, 3]


def test_the_base_acknowledges_exactly_what_each_epoch_sent():
    class Counted(EpochAcknowledgedPartition[int, int]):
        def __init__(self):
            super().__init__(batched=True)
            self.sent, self.acknowledged = [], []

        def send(self, items):
            self.sent += items

        def acknowledge(self, sent):
            self.acknowledged.append(sent)
            return len(self.sent)

    part = Counted()
    part.write_batch([[1, 2], [], [3]])
    part.write_batch([[]])  # an empty batch sends nothing
    assert part.snapshot() == 3 and part.acknowledged == [3]
    part.write_batch([[4]])
    part.close()  # the end of the input acknowledges the last epoch
    assert part.acknowledged == [3, 1] and part.sent == [1, 2, 3, 4]
