"""Read the per-instance state the dataflow snapshotted into its recovery directory.

Bytewax keeps one SQLite file per recovery partition; the stateful step's rows hold the
pickled ``Instance.to_dict()`` of each key at each epoch. The state of record is the
latest snapshot at or before the partition's committed epoch: what a restart resumes
from (the commit lags the newest snapshot by the backup interval). Only read recovery
directories you trust: snapshots are pickles.
"""

from __future__ import annotations

import pickle
import sqlite3
from pathlib import Path
from typing import Any

STATE_STEP = "bandit.stateful_batch"


def read_states(recovery_dir: str | Path, flow_id: str = "tsi") -> dict[str, dict[str, Any]]:
    """{instance key: latest committed snapshot} over all partitions of the directory."""
    files = sorted(Path(recovery_dir).glob("part-*.sqlite3"))
    if not files:
        raise FileNotFoundError(f"no recovery partitions (part-*.sqlite3) in {recovery_dir}")
    states: dict[str, dict[str, Any]] = {}
    for path in files:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            committed = db.execute("SELECT MAX(commit_epoch) FROM commits").fetchone()[0]
            if committed is None:
                continue
            rows = db.execute(
                "SELECT state_key, ser_change FROM snaps AS s WHERE step_id = ? AND snap_epoch ="
                " (SELECT MAX(snap_epoch) FROM snaps WHERE step_id = s.step_id AND"
                "  state_key = s.state_key AND snap_epoch <= ?)",
                (f"{flow_id}.{STATE_STEP}", committed),
            )
            for key, blob in rows:
                if blob is None:
                    states.pop(key, None)
                else:
                    states[key] = pickle.loads(blob)
    return states
