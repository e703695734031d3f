"""The Grafana dashboard (deploy/grafana/tsi-dashboard.json): every metric its panels
query is one the service exports, and Compose and Kubernetes ship the file that exists.

The exported names are collected from the service's registry in-process, after a small
run through the dataflow's test path (memory wiring), so a renamed metric fails here.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from shutil import which

import orjson
import pytest
import yaml
from bytewax.testing import run_main
from prometheus_client import REGISTRY

from flows.service.connectors.memory import memory_wiring
from flows.service.dataflow import build_flow
from flows.service.instances.registry import Registry
from flows.service.wire.events import Origin

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "tsi-dashboard.json"

# PromQL words that are not metric names: functions, aggregations, keywords
_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan",
}  # fmt: skip
_NAME = re.compile(r"(?<![\w.:$])([a-zA-Z_:][\w:]*)(?!\w)(\s*\()?")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads.

    >>> sorted(metric_names('sum by (arm) (rate(a_total{x="y"}[5m])) / ignoring(arm) b'))
    ['a_total', 'b']
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = _LABEL_LIST.sub(" ", text)  # label lists of by (...), on (...), ...
    return {
        m.group(1)
        for m in _NAME.finditer(text)
        if m.group(2) is None and m.group(1).lower() not in _WORDS
    }


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expression) of every target of every panel, rows' panels included."""
    panels = list(dashboard["panels"])
    for row in dashboard["panels"]:
        panels += row.get("panels", [])
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def exported_names() -> set[str]:
    """The sample names the service's registry exports after a small run (labelled
    families without samples yet count by their type's names)."""
    registry = Registry.from_toml('[experiments.home]\narms = ["a", "b"]\ndefault_loss = 1.0')
    events = [
        (orjson.dumps({"type": "request", "experiment": "home", "request_id": f"r{i}"}),
         Origin("ev", 0, i)) for i in range(4)
    ] + [
        (orjson.dumps({"type": "feedback", "experiment": "home", "request_id": "r0", "loss": 0.5}),
         Origin("ev", 0, 10)),
        (b"not json", Origin("ev", 0, 11)),
    ]  # fmt: skip
    run_main(build_flow(registry, memory_wiring([], [], [], [], events=events), lambda: 1e3))
    names = set()
    for family in REGISTRY.collect():
        names |= {s.name for s in family.samples}
        names |= {
            "counter": {f"{family.name}_total"},
            "histogram": {f"{family.name}_{x}" for x in ("bucket", "sum", "count")},
        }.get(family.type, {family.name})
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def test_every_panel_queries_metrics_the_service_exports(dashboard):
    exported = exported_names()
    queries = panel_queries(dashboard)
    assert len(queries) >= 10
    unknown = {
        (title, name)
        for title, expr in queries
        for name in metric_names(expr)
        if name not in exported
    }
    assert unknown == set()
    used = set().union(*(metric_names(e) for _, e in queries))
    assert {"tsi_arm_selections_total", "tsi_arm_share", "tsi_arm_loss_squares_sum",
            "tsi_arm_ips_loss_sum", "tsi_consumer_lag", "tsi_dead_letters_total",
            "tsi_processing_seconds_bucket"} <= used  # fmt: skip


def test_the_name_reader_catches_an_unknown_metric(dashboard):
    broken = json.loads(json.dumps(dashboard))
    broken["panels"][0]["targets"][0]["expr"] = "rate(tsi_arm_selection_total[5m])"
    names = set().union(*(metric_names(e) for _, e in panel_queries(broken)))
    assert "tsi_arm_selection_total" in names - exported_names()


def test_compose_provisions_the_dashboard_that_exists():
    compose_dir = ROOT / "deploy" / "compose"
    compose = yaml.safe_load((compose_dir / "compose.yaml").read_text(encoding="utf-8"))
    services = compose["services"]
    mounts = {
        name: {v.split(":")[0]: v.split(":")[1] for v in s.get("volumes", [])}
        for name, s in services.items()
    }
    grafana = mounts["grafana"]
    sources = {(compose_dir / src).resolve(): dst for src, dst in grafana.items()}
    assert sources[DASHBOARD] == "/var/lib/grafana/dashboards/tsi-dashboard.json"
    provisioning = (GRAFANA / "provisioning").resolve()
    assert sources[provisioning] == "/etc/grafana/provisioning"
    provider = yaml.safe_load((provisioning / "dashboards" / "tsi.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    assert source["datasources"][0]["url"] == "http://prometheus:9090"
    assert "prometheus" in services and "grafana" in services
    prom = {(compose_dir / s).resolve(): d for s, d in mounts["prometheus"].items()}
    config = next(src for src, dst in prom.items() if dst == "/etc/prometheus/prometheus.yml")
    targets = yaml.safe_load(config.read_text())["scrape_configs"][0]["static_configs"][0]
    port = services["tsi-0"]["environment"]["TSI_METRICS_PORT"]
    tsi = sorted(n for n in services if n.startswith("tsi-"))
    assert sorted(targets["targets"]) == [f"{n}:{port}" for n in tsi]


def test_kustomize_ships_the_dashboard_as_a_config_map():
    k8s = ROOT / "deploy" / "k8s"
    kustomization = yaml.safe_load((k8s / "kustomization.yaml").read_text(encoding="utf-8"))
    assert "../grafana" in kustomization["components"]
    component = yaml.safe_load((GRAFANA / "kustomization.yaml").read_text(encoding="utf-8"))
    [generator] = component["configMapGenerator"]
    assert [(GRAFANA / f).resolve() for f in generator["files"]] == [DASHBOARD]
    assert generator["options"]["labels"] == {"grafana_dashboard": "1"}
    if which("kubectl") is None:
        pytest.fail(
            "kubectl is not installed: install it (https://kubernetes.io/docs/tasks/tools/) "
            "to check the manifests `kubectl kustomize deploy/k8s` renders"
        )
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(k8s)], check=True, capture_output=True, text=True
    ).stdout
    [config_map] = [
        d for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "tsi-grafana-dashboard"
    ]  # fmt: skip
    assert config_map["metadata"]["namespace"] == "tsi"
    assert json.loads(config_map["data"]["tsi-dashboard.json"]) == json.loads(
        DASHBOARD.read_text(encoding="utf-8")
    )
