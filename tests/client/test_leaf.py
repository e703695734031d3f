"""The client is a leaf: an application that only wants decisions loads no engine."""

import subprocess
import sys

ENGINE = ("bytewax", "prometheus_client", "tsi_core", "numpy")
SERVICE_PARTS = ("flows.service.shards", "flows.service.instances", "flows.service.observe")


def test_importing_the_client_loads_no_engine_module():
    probe = (
        "import sys, flows.client; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {ENGINE!r} "
        f"or m.startswith({SERVICE_PARTS!r}) or m == 'flows.service.dataflow'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
