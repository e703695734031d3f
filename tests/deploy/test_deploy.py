"""The deployment files (deploy/), checked without a cluster or a container engine.

Every manifest is parsed, and its references are followed: environment variables are ones
`tsi run` reads, TSI_MEMBERS (or a cluster's TSI_ADDRESSES) agrees with the replicas, every
ConfigMap, Secret, volume, claim and probe port named exists, the registry files load, the
Dockerfile exposes the ports the manifests use, the probes and the Compose healthcheck
ask the endpoints of flows/metrics.py that mean what they are used for (/ready: progress,
/healthz: alive). The checkers return a list of problems; each is also shown to catch a
broken copy of the manifests.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from flows.cli.serve import SERVE_OPTIONS
from flows.service.instances.registry import Registry
from flows.service.observe.metrics import Readiness, serve_metrics
from flows.service.runtime.settings import client_config
from flows.service.runtime.settings import options as settings_options
from flows.service.wire.keys import DEFAULT_SHARDS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_DIR = DEPLOY / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

POD_INDEX = "metadata.labels['apps.kubernetes.io/pod-index']"
CLUSTER_DOMAIN = "cluster.local"
# Read by the service outside the `tsi run` options (flows.service.runtime.process, the
# metrics endpoint).
EXTRA_ENV = {"KAFKA_BOOTSTRAP_SERVERS", "TSI_METRICS_PORT"}

Problems = list[str]

# What each Kubernetes probe must ask (flows/metrics.py): liveness and startup on /ready
# would restart the pods in a loop during a broker outage.
PROBE_PATHS = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/ready"}
# Seconds a process may not answer /healthz before the kubelet restarts it (a loaded
# process, a long GIL hold, CPU throttling must not cost a restart).
MIN_LIVENESS_TOLERANCE = 60


# ---------------------------------------------------------------------------- what tsi reads


def tsi_run_envvars() -> set[str]:
    """The environment variables `tsi run` reads: its options' variables (the settings'
    declarations, from which its options are made), plus EXTRA_ENV."""
    return {option.var for option in settings_options()} | EXTRA_ENV


ALLOWED_ENV = tsi_run_envvars()


def test_the_allowed_variables_come_from_the_run_command():
    assert {"TSI_REGISTRY", "TSI_PROCESS_ID", "TSI_ADDRESSES", "TSI_RECOVERY_DIR"} <= ALLOWED_ENV
    assert {"TSI_KAFKA_CONFIG", "TSI_WORKERS", "TSI_TOPIC_DLQ"} <= ALLOWED_ENV
    assert "TSI_NO_SUCH_OPTION" not in ALLOWED_ENV


# ------------------------------------------------------------------------------- Dockerfile


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        instruction, _, args = (pending + line).partition(" ")
        result.append((instruction.upper(), " ".join(args.split())))
        pending = ""
    return result


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (name, _) in enumerate(instructions) if name == "FROM"]
    return instructions[starts[-1] :] if starts else []


def exposed_ports(instructions: list[tuple[str, str]]) -> set[int]:
    return {
        int(port.split("/")[0])
        for name, args in final_stage(instructions)
        if name == "EXPOSE"
        for port in args.split()
    }


def dockerfile_problems(instructions: list[tuple[str, str]]) -> Problems:
    problems: Problems = []
    images = [args.split()[0] for name, args in instructions if name == "FROM"]
    if not images:
        problems.append("Dockerfile: no FROM")
    for image in images:
        if image != "python:3.11-slim":
            problems.append(f"Dockerfile: base image {image}, expected python:3.11-slim")
    last = final_stage(instructions)
    users = [args for name, args in last if name == "USER"]
    if not users:
        problems.append("Dockerfile: the final stage runs as root (no USER)")
    elif users[-1].split(":")[0] in {"root", "0"}:
        problems.append(f"Dockerfile: USER {users[-1]} is root")
    exec_forms = {name: args for name, args in last if name in {"ENTRYPOINT", "CMD"}}
    for name, expected in (("ENTRYPOINT", ["tsi"]), ("CMD", ["run"])):
        try:
            value = json.loads(exec_forms.get(name, "null"))
        except json.JSONDecodeError:
            value = exec_forms[name]
        if value != expected:
            problems.append(f"Dockerfile: {name} is {value!r}, expected {expected!r}")
    installs = [args for name, args in instructions if name == "RUN" and "pip install" in args]
    if not installs:
        problems.append("Dockerfile: the project is never pip-installed")
    for args in installs:
        for command in args.split("&&"):
            words = shlex.split(command)
            if "install" not in words:
                continue
            targets = words[words.index("install") + 1 :]
            if "." not in targets:
                problems.append(f"Dockerfile: `{command.strip()}` does not install the project")
            if any("[" in w or w in {"-e", "--editable"} for w in targets):
                problems.append(f"Dockerfile: `{command.strip()}` installs extras or editable")
    return problems


def copy_sources(instructions: list[tuple[str, str]]) -> list[str]:
    """The build-context paths the Dockerfile copies (COPY without --from)."""
    sources: list[str] = []
    for name, args in instructions:
        if name not in {"COPY", "ADD"}:
            continue
        words = args.split()
        if any(w.startswith("--from") for w in words):
            continue
        words = [w for w in words if not w.startswith("--")]
        sources.extend(words[:-1])
    return sources


def dockerignore_patterns(text: str) -> list[tuple[bool, str]]:
    """(negated, pattern) in file order."""
    patterns = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        patterns.append((negated, pattern))
    return patterns


def _matches(path: str, pattern: str) -> bool:
    parts = PurePosixPath(path).parts
    if pattern.startswith("**/"):
        tail = pattern[3:]
        return any(fnmatch.fnmatchcase("/".join(parts[i:]), tail) for i in range(len(parts)))
    return fnmatch.fnmatchcase(path, pattern)


def dockerignored(path: str, patterns: list[tuple[bool, str]]) -> bool:
    """Whether Docker leaves `path` out of the build context (the last matching rule wins;
    a rule matching a parent directory applies to everything below it)."""
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for negated, pattern in patterns:
        if any(_matches(prefix, pattern) for prefix in prefixes):
            ignored = not negated
    return ignored


def imported_local_packages() -> set[str]:
    """Top-level packages of this repository imported by the installed code."""
    local = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"}
    found = {"flows"}  # the console script: tsi = flows.cli:main
    todo = ["flows"]
    while todo:
        for source in (ROOT / todo.pop()).rglob("*.py"):
            text = source.read_text(encoding="utf-8")
            for name in re.findall(r"^\s*(?:from|import)\s+(\w+)", text, re.MULTILINE):
                if name in local and name not in found:
                    found.add(name)
                    todo.append(name)
    return found


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8"))


def test_the_dockerfile_builds_a_non_root_tsi_image(dockerfile):
    assert dockerfile_problems(dockerfile) == []
    assert exposed_ports(dockerfile) == {2101, 8080, 9108}


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("USER 10001:10001", "USER root", "is root"),
        ("USER 10001:10001", "", "no USER"),
        ("/opt/tsi/bin/pip install .", "/opt/tsi/bin/pip install '.[dev,bench]'", "extras"),
        ("/opt/tsi/bin/pip install .", "/opt/tsi/bin/pip install -e .", "editable"),
        ('ENTRYPOINT ["tsi"]', 'ENTRYPOINT ["python"]', "ENTRYPOINT"),
        ('CMD ["run"]', 'CMD ["simulate"]', "CMD"),
        ("FROM python:3.11-slim\n", "FROM python:3.12\n", "base image"),
    ],
)
def test_the_dockerfile_checker_catches(old, new, expected):
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert old in text
    problems = dockerfile_problems(dockerfile_instructions(text.replace(old, new)))
    assert any(expected in p for p in problems), problems


def test_the_build_context_holds_what_the_image_needs_and_nothing_else(dockerfile):
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text(encoding="utf-8"))
    sources = copy_sources(dockerfile)
    assert sources, "the Dockerfile copies nothing"
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not dockerignored(source, patterns), f"{source} is excluded by .dockerignore"
        for inner in (ROOT / source).rglob("*.py") if (ROOT / source).is_dir() else []:
            relative = inner.relative_to(ROOT).as_posix()
            assert not dockerignored(relative, patterns), relative
    copied_dirs = {PurePosixPath(s).parts[0] for s in sources}
    assert imported_local_packages() <= copied_dirs  # e.g. flows importing arena one day
    for path in (".venv/bin/python", ".git/HEAD", "bench/RESULTS.md", "tests/test_deploy.py"):
        assert dockerignored(path, patterns), path
    for path in ("flows/__pycache__/cli.cpython-311.pyc", ".pytest_cache/v/x", "arena/peers.py"):
        assert dockerignored(path, patterns), path
    # the matcher itself: a later negation re-includes, a parent rule covers its files
    assert not dockerignored("flows/cli.py", [(False, "*"), (True, "flows")])
    assert dockerignored("flows/cli.py", [(False, "*"), (True, "flows"), (False, "flows")])


# ------------------------------------------------------------------------------- Kubernetes


def load_k8s() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    objects = []
    for resource in kustomization["resources"]:
        with (K8S / resource).open(encoding="utf-8") as f:
            objects.extend(doc for doc in yaml.safe_load_all(f) if doc)
    return objects


@pytest.fixture
def manifests() -> list[dict[str, Any]]:
    return load_k8s()


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(matches) == 1, f"{len(matches)} {kind} {name or ''}"
    return matches[0]


def env_entries(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def env_values(container: dict[str, Any]) -> dict[str, str]:
    return {k: str(e["value"]) for k, e in env_entries(container).items() if "value" in e}


def subset(small: dict[str, str] | None, big: dict[str, str]) -> bool:
    return bool(small) and all(big.get(k) == v for k, v in (small or {}).items())


def service_link_names(service: str) -> set[str]:
    """Variables the kubelet injects for a Service unless enableServiceLinks is false."""
    base = service.upper().replace("-", "_")
    return {f"{base}_SERVICE_HOST", f"{base}_SERVICE_PORT", f"{base}_PORT"}


def _under(path: str, directory: str) -> str | None:
    """`path` relative to `directory`, or None when it is not inside it."""
    try:
        return PurePosixPath(path).relative_to(directory).as_posix()
    except ValueError:
        return None


def _mounted_file_problems(
    where: str,
    variable: str,
    path: str,
    mounts: list[dict[str, Any]],
    volumes: dict[str, dict[str, Any]],
    objects: dict[tuple[str, str], dict[str, Any]],
) -> Problems:
    """The file named by `variable` must be a key of a mounted ConfigMap or Secret."""
    for mount in mounts:
        relative = _under(path, mount["mountPath"])
        if relative is None or relative == ".":
            continue
        volume = volumes.get(mount["name"], {})
        if "configMap" in volume:
            source = objects.get(("ConfigMap", volume["configMap"]["name"]), {})
            keys = set(source.get("data", {}))
        elif "secret" in volume:
            source = objects.get(("Secret", volume["secret"]["secretName"]), {})
            keys = set(source.get("data", {})) | set(source.get("stringData", {}))
        else:
            return [f"{where}: {variable}={path} is on volume {mount['name']}, not a ConfigMap"]
        if relative not in keys:
            return [f"{where}: {variable}={path}: no key {relative!r} in the mounted object"]
        return []
    return [f"{where}: {variable}={path} is not inside any volumeMount"]


def _probe_port(probe: dict[str, Any]) -> Any:
    for handler in ("httpGet", "tcpSocket", "grpc"):
        if handler in probe:
            return probe[handler]["port"]
    return None


def _probe_problems(where: str, container: dict[str, Any]) -> Problems:
    """Each probe GETs its path (PROBE_PATHS) on the metrics port; liveness is patient."""
    problems: Problems = []
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    metrics = env_values(container).get("TSI_METRICS_PORT")
    for kind, path in PROBE_PATHS.items():
        probe = container.get(kind)
        if probe is None:
            continue  # reported with the other probe checks
        get = probe.get("httpGet")
        if get is None:
            problems.append(f"{where}: {kind} is no httpGet of {path}")
            continue
        if get.get("path") != path:
            why = " (a broker outage would restart the pods)" if get.get("path") == "/ready" else ""
            problems.append(f"{where}: {kind} GETs {get.get('path')!r}, expected {path}{why}")
        if metrics is None or ports.get(get["port"], get["port"]) != int(metrics):
            problems.append(
                f"{where}: {kind} port {get['port']!r} is not the metrics port "
                f"(TSI_METRICS_PORT {metrics})"
            )
    liveness = container.get("livenessProbe") or {}
    patience = liveness.get("periodSeconds", 10) * liveness.get("failureThreshold", 3)
    if patience < MIN_LIVENESS_TOLERANCE:
        problems.append(
            f"{where}: livenessProbe restarts after {patience} s without an answer "
            f"(< {MIN_LIVENESS_TOLERANCE} s)"
        )
    return problems


SERVE_ENV = {option.var for option in SERVE_OPTIONS}
#: What the gateway and the members must agree on.
SHARED_ENV = (
    "KAFKA_BOOTSTRAP_SERVERS",
    "TSI_KAFKA_CONFIG",
    "TSI_REGISTRY",
    "TSI_TOPIC_REQUESTS",
    "TSI_TOPIC_FEEDBACK",
    "TSI_TOPIC_SELECTIONS",
    "TSI_TOPIC_EVENTS",
)
GATEWAY_PROBES = {
    "startupProbe": "/healthz",
    "livenessProbe": "/healthz",
    "readinessProbe": "/ready",
}


def member_metrics_urls(sts: dict[str, Any]) -> list[str]:
    """The metrics url of each pod of the members' StatefulSet, by its stable name."""
    spec = sts["spec"]
    container = spec["template"]["spec"]["containers"][0]
    port = env_values(container).get("TSI_METRICS_PORT")
    host = f"{spec.get('serviceName')}.{sts['metadata'].get('namespace')}.svc.{CLUSTER_DOMAIN}"
    name = sts["metadata"]["name"]
    return [f"http://{name}-{i}.{host}:{port}/metrics" for i in range(spec.get("replicas", 1))]


def gateway_problems(
    deployment: dict[str, Any],
    statefulsets: list[dict[str, Any]],
    index: dict[tuple[str, str], dict[str, Any]],
) -> Problems:
    """A Deployment running `tsi serve`: it reads only serve's variables, agrees with the
    members on brokers, Kafka settings, registry and topics, asks each member's metrics,
    listens beyond localhost, probes its own port, and a Service routes to it."""
    where = f"Deployment/{deployment['metadata']['name']}"
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"].get("labels", {})
    containers = pod.get("containers", [])
    if [c.get("args", c.get("command")) for c in containers] != [["serve"]]:
        return [f"{where}: does not run one `tsi serve` container"]
    if not statefulsets:
        return [f"{where}: no members to serve"]
    container, member = containers[0], statefulsets[0]
    values = env_values(container)
    members = env_values(member["spec"]["template"]["spec"]["containers"][0])
    problems = [f"{where}: tsi serve does not read {v}" for v in sorted(set(values) - SERVE_ENV)]
    for variable in SHARED_ENV:
        if values.get(variable) != members.get(variable):
            problems.append(
                f"{where}: {variable} {values.get(variable)!r} is not the members' "
                f"{members.get(variable)!r}"
            )
    urls = values.get("TSI_SERVE_METRICS_URL", "").split(",")
    if urls != member_metrics_urls(member):
        problems.append(
            f"{where}: TSI_SERVE_METRICS_URL {urls}, expected {member_metrics_urls(member)}"
        )
    if values.get("TSI_SERVE_HOST", "127.0.0.1") in ("127.0.0.1", "localhost"):
        problems.append(f"{where}: listens on localhost, unreachable from its Service")
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    if str(ports.get("http")) != values.get("TSI_SERVE_PORT"):
        problems.append(f"{where}: container port http is not TSI_SERVE_PORT")
    for kind, path in GATEWAY_PROBES.items():
        get = (container.get(kind) or {}).get("httpGet", {})
        if (get.get("path"), get.get("port")) != (path, "http"):
            problems.append(f"{where}: {kind} is not GET {path} on port http")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = container.get("volumeMounts", [])
    for variable in ("TSI_REGISTRY", "TSI_KAFKA_CONFIG"):
        if variable in values:
            problems += _mounted_file_problems(
                where, variable, values[variable], mounts, volumes, index
            )
    routed = [
        s
        for s in index.values()
        if s["kind"] == "Service" and subset(s["spec"].get("selector"), labels)
    ]
    if not any(p.get("targetPort") == "http" for s in routed for p in s["spec"]["ports"]):
        problems.append(f"{where}: no Service routes to its port http")
    if pod.get("securityContext", {}).get("runAsNonRoot") is not True:
        problems.append(f"{where}: pods may run as root")
    if container.get("securityContext", {}).get("allowPrivilegeEscalation") is not False:
        problems.append(f"{where}: allowPrivilegeEscalation is not false")
    return problems


def k8s_problems(objects: list[dict[str, Any]]) -> Problems:
    problems: Problems = []
    index = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    namespaces = {name for kind, name in index if kind == "Namespace"}
    for (kind, name), obj in index.items():
        if kind != "Namespace" and obj["metadata"].get("namespace") not in namespaces:
            problems.append(f"{kind}/{name}: namespace {obj['metadata'].get('namespace')!r}")
    services = [o for o in objects if o["kind"] == "Service"]
    statefulsets = [o for o in objects if o["kind"] == "StatefulSet"]
    deployments = [
        o["spec"]["template"]["metadata"].get("labels", {})
        for o in objects
        if o["kind"] == "Deployment"
    ]
    if not statefulsets:
        problems.append("no StatefulSet")
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        problems += gateway_problems(deployment, statefulsets, index)
    for sts in statefulsets:
        name = sts["metadata"]["name"]
        namespace = sts["metadata"].get("namespace")
        spec = sts["spec"]
        pod = spec["template"]["spec"]
        labels = spec["template"]["metadata"].get("labels", {})
        replicas = spec.get("replicas", 1)
        where = f"StatefulSet/{name}"
        if not subset(spec["selector"].get("matchLabels"), labels):
            problems.append(f"{where}: selector {spec['selector']} does not match pod labels")
        containers = pod.get("containers", [])
        every = containers + pod.get("initContainers", [])
        port_names = {p["name"]: p["containerPort"] for c in containers for p in c.get("ports", [])}

        # the headless Service that names the pods, and its cluster port
        headless = index.get(("Service", spec.get("serviceName", "")))
        cluster_port = None
        if headless is None:
            problems.append(f"{where}: serviceName {spec.get('serviceName')!r} is no Service")
        else:
            hs = headless["spec"]
            if hs.get("clusterIP") != "None":
                problems.append(f"{where}: Service {spec['serviceName']} is not headless")
            if hs.get("publishNotReadyAddresses") is not True:
                problems.append(f"{where}: {spec['serviceName']} hides not-ready pods")
            cluster = [p for p in hs.get("ports", []) if p.get("name") == "cluster"]
            if "cluster" in port_names and len(cluster) != 1:  # a Bytewax cluster's port
                problems.append(f"{where}: {spec['serviceName']} has no port named cluster")
            elif cluster:
                cluster_port = cluster[0]["port"]
                if port_names.get("cluster") != cluster_port:
                    problems.append(
                        f"{where}: container port cluster {port_names.get('cluster')} "
                        f"!= Service port {cluster_port}"
                    )

        # Services and PodDisruptionBudgets that select these pods, and their target ports
        for svc in services:
            if svc["metadata"].get("namespace") != namespace:
                continue
            svc_name = svc["metadata"]["name"]
            if not subset(svc["spec"].get("selector"), labels):
                if not any(subset(svc["spec"].get("selector"), d) for d in deployments):
                    problems.append(f"{where}: Service {svc_name} selects no pod of it")
                continue
            serves_metrics = any(p.get("name") == "metrics" for p in svc["spec"].get("ports", []))
            if serves_metrics and svc["spec"].get("publishNotReadyAddresses") is not True:
                problems.append(
                    f"{where}: Service {svc_name} hides the metrics of not-ready pods "
                    "(set publishNotReadyAddresses: true)"
                )
            for port in svc["spec"].get("ports", []):
                target = port.get("targetPort", port["port"])
                if target not in (set(port_names) | set(port_names.values())):
                    problems.append(f"{where}: Service {svc_name} targets undeclared {target!r}")
            if pod.get("enableServiceLinks", True) and service_link_names(svc_name) & ALLOWED_ENV:
                problems.append(
                    f"{where}: Service {svc_name} would inject "
                    f"{sorted(service_link_names(svc_name) & ALLOWED_ENV)}: "
                    "set enableServiceLinks: false"
                )
        for pdb in (o for o in objects if o["kind"] == "PodDisruptionBudget"):
            if not subset(pdb["spec"]["selector"].get("matchLabels"), labels):
                problems.append(f"PodDisruptionBudget/{pdb['metadata']['name']} selects no pod")
            if pdb["spec"].get("unhealthyPodEvictionPolicy") != "AlwaysAllow":
                problems.append(
                    f"PodDisruptionBudget/{pdb['metadata']['name']}: pods not ready (all of "
                    "them during a Kafka outage) would block node drains; set "
                    "unhealthyPodEvictionPolicy: AlwaysAllow"
                )

        # volumes, claims and what they refer to
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
        for volume in volumes.values():
            if "configMap" in volume:
                ref = ("ConfigMap", volume["configMap"]["name"])
            elif "secret" in volume:
                ref = ("Secret", volume["secret"]["secretName"])
            else:
                continue
            if ref not in index:
                problems.append(f"{where}: volume {volume['name']} refers to missing {ref}")
        mounted = {m["name"] for c in every for m in c.get("volumeMounts", [])}
        for unused in (set(volumes) | claims) - mounted:
            problems.append(f"{where}: volume or claim {unused} is never mounted")

        # the pod as a whole
        security = pod.get("securityContext", {})
        if security.get("runAsNonRoot") is not True or security.get("runAsUser", 1) == 0:
            problems.append(f"{where}: pods may run as root")
        if not pod.get("terminationGracePeriodSeconds"):
            problems.append(f"{where}: no terminationGracePeriodSeconds")

        for container in every:
            cwhere = f"{where} container {container['name']}"
            entries = env_entries(container)
            values = env_values(container)
            if len(entries) != len(container.get("env", [])):
                problems.append(f"{cwhere}: a variable is set twice")
            for unknown in sorted(set(entries) - ALLOWED_ENV):
                problems.append(f"{cwhere}: tsi run does not read {unknown}")
            mounts = container.get("volumeMounts", [])
            for mount in mounts:
                if mount["name"] not in volumes and mount["name"] not in claims:
                    problems.append(f"{cwhere}: mounts unknown volume {mount['name']}")
            resources = container.get("resources", {})
            for part in ("requests", "limits"):
                missing = {"cpu", "memory"} - set(resources.get(part, {}))
                if missing:
                    problems.append(f"{cwhere}: no {part} for {sorted(missing)}")
            csec = container.get("securityContext", {})
            if csec.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{cwhere}: allowPrivilegeEscalation is not false")

            # the cluster: one address per replica, in pod-index order, process id = index
            if "TSI_ADDRESSES" in entries or "TSI_PROCESS_ID" in entries:
                expected = [
                    f"{name}-{i}.{spec.get('serviceName')}.{namespace}.svc.{CLUSTER_DOMAIN}"
                    f":{cluster_port}"
                    for i in range(replicas)
                ]
                actual = values.get("TSI_ADDRESSES", "").split(";")
                if actual != expected:
                    problems.append(
                        f"{cwhere}: TSI_ADDRESSES has {len(actual)} entries {actual}, "
                        f"expected {len(expected)} (replicas): {expected}"
                    )
                field = entries.get("TSI_PROCESS_ID", {}).get("valueFrom", {}).get("fieldRef", {})
                if field.get("fieldPath") != POD_INDEX:
                    problems.append(f"{cwhere}: TSI_PROCESS_ID does not come from {POD_INDEX}")
            # members: as many as replicas, member = pod index
            if "TSI_MEMBERS" in entries or "TSI_MEMBER" in entries:
                if values.get("TSI_MEMBERS") != str(replicas):
                    problems.append(
                        f"{cwhere}: TSI_MEMBERS is {values.get('TSI_MEMBERS')!r}, expected "
                        f"{replicas} (replicas)"
                    )
                field = entries.get("TSI_MEMBER", {}).get("valueFrom", {}).get("fieldRef", {})
                if field.get("fieldPath") != POD_INDEX:
                    problems.append(f"{cwhere}: TSI_MEMBER does not come from {POD_INDEX}")

        for container in containers:
            cwhere = f"{where} container {container['name']}"
            values = env_values(container)
            mounts = container.get("volumeMounts", [])
            declared = {p["name"] for p in container.get("ports", [])}
            numbers = {p["containerPort"] for p in container.get("ports", [])}
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = container.get(kind)
                if probe is None:
                    problems.append(f"{cwhere}: no {kind}")
                    continue
                port = _probe_port(probe)
                if port not in declared and port not in numbers:
                    problems.append(f"{cwhere}: {kind} port {port!r} is not a container port")
            problems += _probe_problems(cwhere, container)
            metrics = values.get("TSI_METRICS_PORT")
            if metrics is not None and int(metrics) != port_names.get("metrics"):
                problems.append(f"{cwhere}: TSI_METRICS_PORT {metrics} is not port metrics")
            if container.get("args", container.get("command")) != ["run"]:
                problems.append(f"{cwhere}: does not run `tsi run`")
            recovery = values.get("TSI_RECOVERY_DIR")
            if recovery is None:
                problems.append(f"{cwhere}: no TSI_RECOVERY_DIR")
            elif not any(
                m["name"] in claims and _under(recovery, m["mountPath"]) is not None for m in mounts
            ):
                problems.append(f"{cwhere}: TSI_RECOVERY_DIR {recovery} is on no claim")
            for variable in ("TSI_REGISTRY", "TSI_KAFKA_CONFIG"):
                if variable in values:
                    problems += _mounted_file_problems(
                        cwhere, variable, values[variable], mounts, volumes, index
                    )
            if "TSI_REGISTRY" not in values:
                problems.append(f"{cwhere}: no TSI_REGISTRY")
    return problems


def test_the_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    assert kustomization["namespace"] == "tsi"


def test_the_kubernetes_manifests_are_consistent(manifests):
    assert k8s_problems(manifests) == []
    kinds = {(o["kind"], o["metadata"]["name"]) for o in manifests}
    assert {
        ("Namespace", "tsi"),
        ("ConfigMap", "tsi-registry"),
        ("Secret", "tsi-kafka"),
        ("Service", "tsi-headless"),
        ("Service", "tsi-metrics"),
        ("StatefulSet", "tsi"),
    } <= kinds
    sts = find(manifests, "StatefulSet", "tsi")["spec"]
    assert sts["replicas"] == 3 and sts["podManagementPolicy"] == "Parallel"
    assert sts["serviceName"] == "tsi-headless"
    assert [c["metadata"]["name"] for c in sts["volumeClaimTemplates"]] == ["recovery"]
    metrics = find(manifests, "Service", "tsi-metrics")["spec"]["ports"]
    assert [p["port"] for p in metrics] == [9108]
    container = _main(manifests)
    paths = {kind: container[kind]["httpGet"]["path"] for kind in PROBE_PATHS}
    assert paths == PROBE_PATHS
    assert {container[kind]["httpGet"]["port"] for kind in PROBE_PATHS} == {"metrics"}


def test_the_configured_files_load(manifests, tmp_path):
    registry = find(manifests, "ConfigMap", "tsi-registry")["data"]["registry.toml"]
    assert Registry.from_toml(registry).experiments
    kafka = find(manifests, "Secret", "tsi-kafka")["stringData"]["kafka.toml"]
    (tmp_path / "kafka.toml").write_text(kafka, encoding="utf-8")
    consumer, producer = client_config(tmp_path / "kafka.toml")
    for settings in (consumer, producer):
        assert settings["security.protocol"] == "SASL_SSL"
        assert {"sasl.mechanism", "sasl.username", "sasl.password"} <= set(settings)


def _statefulset(objects):
    return find(objects, "StatefulSet")


def _main(objects):
    return _statefulset(objects)["spec"]["template"]["spec"]["containers"][0]


def _set_env(container, name, value):
    for entry in container["env"]:
        if entry["name"] == name:
            entry.pop("valueFrom", None)
            entry["value"] = value
            return
    container["env"].append({"name": name, "value": value})


def _fewer_members(objects):
    _set_env(_main(objects), "TSI_MEMBERS", "2")


def _a_bytewax_cluster_without_its_port(objects):
    sts = _statefulset(objects)
    _set_env(_main(objects), "TSI_ADDRESSES", "tsi-0.tsi-headless.tsi.svc.cluster.local:2101")
    _main(objects)["ports"].append({"name": "cluster", "containerPort": 2101})
    sts["spec"]["replicas"] = 1


def _more_replicas(objects):
    _statefulset(objects)["spec"]["replicas"] = 4


def _other_service_name(objects):
    _statefulset(objects)["spec"]["serviceName"] = "tsi"


def _not_headless(objects):
    find(objects, "Service", "tsi-headless")["spec"].pop("clusterIP")


def _selector_mismatch(objects):
    _statefulset(objects)["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "tsj"


def _registry_typo(objects):
    volumes = _statefulset(objects)["spec"]["template"]["spec"]["volumes"]
    next(v for v in volumes if "configMap" in v)["configMap"]["name"] = "tsi-registy"


def _secret_typo(objects):
    volumes = _statefulset(objects)["spec"]["template"]["spec"]["volumes"]
    next(v for v in volumes if "secret" in v)["secret"]["secretName"] = "kafka"


def _registry_key_typo(objects):
    _set_env(_main(objects), "TSI_REGISTRY", "/etc/tsi/registry/experiments.toml")


def _unknown_mount(objects):
    _main(objects)["volumeMounts"].append({"name": "scratch", "mountPath": "/scratch"})


def _recovery_off_the_claim(objects):
    _set_env(_main(objects), "TSI_RECOVERY_DIR", "/tmp/recovery")


def _probe_port_typo(objects):
    _main(objects)["livenessProbe"]["httpGet"]["port"] = "metric"


def _no_readiness(objects):
    _main(objects).pop("readinessProbe")


def _readiness_on_metrics(objects):
    _main(objects)["readinessProbe"]["httpGet"]["path"] = "/metrics"


def _liveness_on_ready(objects):
    _main(objects)["livenessProbe"]["httpGet"]["path"] = "/ready"


def _startup_on_ready(objects):
    _main(objects)["startupProbe"]["httpGet"]["path"] = "/ready"


def _eager_liveness(objects):
    _main(objects)["livenessProbe"]["failureThreshold"] = 1


def _readiness_on_the_cluster_port(objects):
    _main(objects)["readinessProbe"]["httpGet"]["port"] = "cluster"


def _readiness_as_tcp(objects):
    _main(objects)["readinessProbe"] = {"tcpSocket": {"port": "metrics"}, "periodSeconds": 10}


def _metrics_hide_not_ready(objects):
    find(objects, "Service", "tsi-metrics")["spec"].pop("publishNotReadyAddresses")


def _pdb_blocks_drains(objects):
    find(objects, "PodDisruptionBudget")["spec"].pop("unhealthyPodEvictionPolicy")


def _no_limits(objects):
    _main(objects)["resources"].pop("limits")


def _unknown_variable(objects):
    _main(objects)["env"].append({"name": "TSI_REGISTY", "value": "/etc/tsi/x.toml"})


def _member_from_pod_name(objects):
    entry = env_entries(_main(objects))["TSI_MEMBER"]
    entry["valueFrom"]["fieldRef"]["fieldPath"] = "metadata.name"


def _service_links(objects):
    _statefulset(objects)["spec"]["template"]["spec"].pop("enableServiceLinks")


def _root(objects):
    _statefulset(objects)["spec"]["template"]["spec"]["securityContext"]["runAsUser"] = 0


def _other_namespace(objects):
    find(objects, "Service", "tsi-metrics")["metadata"]["namespace"] = "default"


def _pdb_selects_nothing(objects):
    find(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] = {"app": "x"}


def _gateway(objects):
    return find(objects, "Deployment", "tsi-gateway")["spec"]["template"]["spec"]["containers"][0]


def _gateway_with_three_members_two_urls(objects):
    url = env_values(_gateway(objects))["TSI_SERVE_METRICS_URL"]
    _set_env(_gateway(objects), "TSI_SERVE_METRICS_URL", url.rsplit(",", 1)[0])


def _gateway_other_topic(objects):
    _set_env(_gateway(objects), "TSI_TOPIC_SELECTIONS", "tsi.answers")


def _gateway_reading_a_run_variable(objects):
    _set_env(_gateway(objects), "TSI_RECOVERY_DIR", "/var/lib/tsi")


def _gateway_without_service(objects):
    objects[:] = [
        o for o in objects if o["metadata"]["name"] != "tsi-gateway" or o["kind"] != "Service"
    ]


def _gateway_ready_probe_on_healthz(objects):
    _gateway(objects)["readinessProbe"]["httpGet"]["path"] = "/healthz"


K8S_MUTATIONS: dict[str, tuple[Callable[[list[dict[str, Any]]], None], str]] = {
    "gateway missing a member's metrics": (_gateway_with_three_members_two_urls, "METRICS_URL"),
    "members scaled, gateway not": (_more_replicas, "TSI_SERVE_METRICS_URL"),
    "gateway on another topic": (_gateway_other_topic, "TSI_TOPIC_SELECTIONS 'tsi.answers'"),
    "gateway reading a run variable": (_gateway_reading_a_run_variable, "does not read TSI_RE"),
    "gateway without a Service": (_gateway_without_service, "no Service routes to its port"),
    "gateway ready on /healthz": (_gateway_ready_probe_on_healthz, "readinessProbe is not GET"),
    "fewer members than replicas": (_fewer_members, "TSI_MEMBERS is '2', expected 3"),
    "replicas without new members": (_more_replicas, "expected 4 (replicas)"),
    "a Bytewax cluster's port not on the headless Service": (
        _a_bytewax_cluster_without_its_port,
        "has no port named cluster",
    ),
    "serviceName not the headless Service": (_other_service_name, "serviceName"),
    "headless Service with a cluster IP": (_not_headless, "not headless"),
    "selector not matching the pods": (_selector_mismatch, "selector"),
    "missing ConfigMap": (_registry_typo, "missing ('ConfigMap', 'tsi-registy')"),
    "missing Secret": (_secret_typo, "missing ('Secret', 'kafka')"),
    "registry file not in the ConfigMap": (_registry_key_typo, "no key 'experiments.toml'"),
    "mount of an undeclared volume": (_unknown_mount, "unknown volume scratch"),
    "recovery outside the claim": (_recovery_off_the_claim, "is on no claim"),
    "probe on an undeclared port": (_probe_port_typo, "port 'metric'"),
    "no readiness probe": (_no_readiness, "no readinessProbe"),
    "readiness on /metrics": (_readiness_on_metrics, "readinessProbe GETs '/metrics'"),
    "liveness on /ready": (_liveness_on_ready, "livenessProbe GETs '/ready', expected /healthz"),
    "startup on /ready": (_startup_on_ready, "startupProbe GETs '/ready', expected /healthz"),
    "liveness restarting after 10 s": (_eager_liveness, "livenessProbe restarts after 10 s"),
    "readiness on the cluster port": (_readiness_on_the_cluster_port, "port 'cluster' is not"),
    "readiness as a TCP check": (_readiness_as_tcp, "readinessProbe is no httpGet of /ready"),
    "metrics Service hiding not-ready pods": (_metrics_hide_not_ready, "hides the metrics"),
    "PDB blocking drains of not-ready pods": (_pdb_blocks_drains, "unhealthyPodEvictionPolicy"),
    "no limits": (_no_limits, "no limits"),
    "variable tsi run does not read": (_unknown_variable, "does not read TSI_REGISTY"),
    "member from the pod name": (_member_from_pod_name, "TSI_MEMBER does not come"),
    "service links inject TSI_METRICS_PORT": (_service_links, "TSI_METRICS_PORT"),
    "root user": (_root, "as root"),
    "object in another namespace": (_other_namespace, "Service/tsi-metrics: namespace"),
    "PDB selecting nothing": (_pdb_selects_nothing, "PodDisruptionBudget/tsi selects no pod"),
}


@pytest.mark.parametrize("mutation", K8S_MUTATIONS)
def test_the_kubernetes_checker_catches(manifests, mutation):
    mutate, expected = K8S_MUTATIONS[mutation]
    broken = copy.deepcopy(manifests)
    mutate(broken)
    problems = k8s_problems(broken)
    assert any(expected in p for p in problems), problems


# ---------------------------------------------------------------------------------- Compose


def load_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


@pytest.fixture
def compose() -> dict[str, Any]:
    return load_compose()


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def compose_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each volume entry, short or long syntax."""
    mounts = []
    for entry in service.get("volumes", []):
        if isinstance(entry, str):
            source, target = entry.split(":")[:2]
        else:
            source, target = entry.get("source", ""), entry["target"]
        mounts.append((source, target))
    return mounts


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {k: (v or {}).get("condition", "service_started") for k, v in deps.items()}


def is_named_volume(source: str) -> bool:
    return bool(source) and not source.startswith((".", "/", "~"))


def healthcheck_script(service: dict[str, Any]) -> str | None:
    """The Python source of a `["CMD", "python", "-c", source]` healthcheck, else None."""
    test = (service.get("healthcheck") or {}).get("test")
    if isinstance(test, list) and len(test) == 4 and test[:3] == ["CMD", "python", "-c"]:
        return test[3]
    return None


def _healthcheck_problems(name: str, service: dict[str, Any]) -> Problems:
    """A process is healthy while it makes progress: /ready on TSI_METRICS_PORT."""
    check = service.get("healthcheck")
    if not check or check.get("disable"):
        return [f"{name}: no healthcheck"]
    script = healthcheck_script(service)
    if script is None:
        return [f"{name}: the healthcheck is not ['CMD', 'python', '-c', <script>]"]
    problems = []
    if "/ready" not in script:
        problems.append(f"{name}: the healthcheck does not ask /ready")
    if "TSI_METRICS_PORT" not in script:
        problems.append(f"{name}: the healthcheck does not read TSI_METRICS_PORT")
    return problems


def parsed_command(service: dict[str, Any]) -> tuple[str, Any]:
    """A tsi service's command parsed by the real ``tsi`` command line, with its
    environment and nothing else (no run: the command's action is replaced by one keeping
    what it was given): ("run", Settings) for ``tsi run``, ("topics", {topic names,
    partitions, changelog}) for ``tsi topics create``, ("serve", {settings, metrics urls,
    registry, host, port}) for ``tsi serve``, ("refused", the error) otherwise."""
    from unittest import mock

    from typer.testing import CliRunner

    from flows.cli import app

    got: dict[str, Any] = {}

    def create(brokers, consumer, names, **given):
        got["topics"] = {"names": names, **given}
        return []

    def gateway(settings, live, known, keys=None, store=None):
        return {
            "settings": settings,
            "metrics_urls": list(live.urls),
            "registry": None if known is None else known.path,
            "keys": keys,
        }

    def serve(app, host, port, **_):
        got["serve"] = {**app, "host": host, "port": port}

    unset = {k: None for k in os.environ if k.startswith(("TSI_", "KAFKA_"))}
    with (
        mock.patch("flows.cli.run.serve", lambda settings: got.update(run=settings)),
        mock.patch("flows.gateway.app.gateway", gateway),
        mock.patch(  # the registry file is not read here
            "flows.gateway.known.Known", lambda path: SimpleNamespace(path=str(path), current=None)
        ),
        mock.patch("uvicorn.run", serve),
        mock.patch("flows.service.connectors.kafka_admin.create_topics", create),
        mock.patch(  # no topic exists yet (tsi topics create reads an existing changelog)
            "flows.service.connectors.kafka_admin.topic_infos",
            lambda brokers, consumer, names, timeout: dict.fromkeys(names),
        ),
    ):
        done = CliRunner().invoke(
            app, list(service.get("command") or []), env={**unset, **compose_env(service)}
        )
    if done.exit_code != 0 or len(got) != 1:
        said = done.output.strip().splitlines() or [repr(done.exception)]
        return "refused", said[-1]
    return next(iter(got.items()))


def compose_problems(doc: dict[str, Any], ports: set[int]) -> Problems:
    """`ports`: the ports the image exposes."""
    problems: Problems = []
    services = doc.get("services", {})
    declared_volumes = set(doc.get("volumes") or {})
    for name, service in services.items():
        for target in depends_on(service):
            if target not in services:
                problems.append(f"{name}: depends_on unknown service {target}")
        for source, _ in compose_mounts(service):
            if is_named_volume(source) and source not in declared_volumes:
                problems.append(f"{name}: volume {source} is not declared")

    built = {
        name: s
        for name, s in services.items()
        if isinstance(s.get("build"), dict)
        and (COMPOSE_DIR / s["build"].get("context", ".") / s["build"]["dockerfile"]).resolve()
        == DOCKERFILE
    }
    parsed = {name: parsed_command(service) for name, service in built.items()}
    for name, (kind, said) in parsed.items():
        if kind == "refused":
            problems.append(f"{name}: tsi refuses its command: {said}")
    processes = {name: built[name] for name, (kind, _) in parsed.items() if kind == "run"}
    jobs = {name: said for name, (kind, said) in parsed.items() if kind == "topics"}
    if not processes:
        return [*problems, "no service runs `tsi run` from deploy/Dockerfile"]
    if len(jobs) != 1:
        return [*problems, f"{len(jobs)} services run `tsi topics create`, not one"]
    job_name, job = next(iter(jobs.items()))
    by_index: dict[int, str] = {}
    counts = set()
    recovery_volumes: dict[str, str] = {}
    for name, service in processes.items():
        settings = parsed[name][1]
        env = compose_env(service)
        for unknown in sorted(set(env) - ALLOWED_ENV):
            problems.append(f"{name}: tsi run does not read {unknown}")
        if (COMPOSE_DIR / service["build"].get("context", ".")).resolve() != ROOT:
            problems.append(f"{name}: the build context is not the repository root")
        if settings.member in by_index:
            problems.append(
                f"{name}: --member {settings.member} is also {by_index[settings.member]}'s"
            )
        by_index[settings.member] = name
        counts.add(settings.members)
        mounts = compose_mounts(service)
        recovery = env.get("TSI_RECOVERY_DIR")
        volume = next(
            (
                source
                for source, target in mounts
                if recovery and is_named_volume(source) and _under(recovery, target) is not None
            ),
            None,
        )
        if volume is None:
            problems.append(f"{name}: TSI_RECOVERY_DIR {recovery} is on no named volume")
        elif volume in recovery_volumes:
            problems.append(
                f"{name}: shares recovery volume {volume} with {recovery_volumes[volume]}"
            )
        else:
            recovery_volumes[volume] = name
        registry = env.get("TSI_REGISTRY")
        sources = [s for s, t in mounts if t == registry and not is_named_volume(s)]
        if not sources:
            problems.append(f"{name}: TSI_REGISTRY {registry} is not a mounted file")
        else:
            path = COMPOSE_DIR / sources[0]
            try:
                Registry.load(path)
            except ValueError as exc:
                problems.append(f"{name}: {path}: {exc}")
        if depends_on(service).get(job_name) != "service_completed_successfully":
            problems.append(f"{name}: does not wait for the topics to be created")
        metrics = env.get("TSI_METRICS_PORT")
        if metrics is None or int(metrics) not in ports:
            problems.append(f"{name}: TSI_METRICS_PORT {metrics} is not exposed by the image")
        problems += _healthcheck_problems(name, service)
        bootstrap = env.get("KAFKA_BOOTSTRAP_SERVERS", "")
        host = bootstrap.split(":")[0]
        advertised = compose_env(services.get(host, {})).get("KAFKA_ADVERTISED_LISTENERS", "")
        if f"//{bootstrap}" not in advertised:
            problems.append(
                f"{name}: KAFKA_BOOTSTRAP_SERVERS {bootstrap} is no advertised listener"
            )
        created = set(job["names"]) | {(job["changelog"] or ("",))[0]}
        topics = vars(settings.topics)
        for field, topic in topics.items():
            if isinstance(topic, str) and topic and topic not in created:
                problems.append(f"{name}: its {field} topic {topic} is never created")

    gateways = {name: said for name, (kind, said) in parsed.items() if kind == "serve"}
    for name, said in gateways.items():
        problems += _gateway_problems(name, said, services, processes, parsed, ports)

    n = len(processes)
    if counts != {n} or sorted(by_index) != list(range(n)):
        problems.append(
            f"the members are {sorted(by_index)} of {sorted(counts)}: "
            f"give the {n} members --members {n} and --member 0..{n - 1}"
        )
    partitions = job.get("partitions")
    if partitions is None or partitions < n:
        problems.append(f"{job_name}: {partitions} partitions per topic for {n} members")
    return problems


def _gateway_problems(
    name: str,
    said: dict[str, Any],
    services: dict[str, Any],
    processes: dict[str, Any],
    parsed: dict[str, tuple[str, Any]],
    ports: set[int],
) -> Problems:
    """A `tsi serve` service: the members' brokers and topics, a metrics url for each
    member's metrics port, its registry a mounted file that loads, its port exposed."""
    problems: Problems = []
    service = services[name]
    settings = said["settings"]
    members = {parsed[m][1].topics for m in processes} | {settings.topics}
    if len(members) != 1:
        problems.append(f"{name}: its topics are not the members' topics")
    brokers = {compose_env(processes[m]).get("KAFKA_BOOTSTRAP_SERVERS") for m in processes}
    if brokers != {settings.brokers}:
        problems.append(f"{name}: brokers {settings.brokers} are not the members' {brokers}")
    expected = {
        f"http://{m}:{compose_env(processes[m]).get('TSI_METRICS_PORT')}/metrics" for m in processes
    }
    if set(said["metrics_urls"]) != expected:
        problems.append(
            f"{name}: --metrics-url {said['metrics_urls']}, expected {sorted(expected)}"
        )
    registry = said["registry"]
    sources = [s for s, t in compose_mounts(service) if t == registry and not is_named_volume(s)]
    if registry is None or not sources:
        problems.append(f"{name}: its registry {registry} is not a mounted file")
    if said["port"] not in ports:
        problems.append(f"{name}: port {said['port']} is not exposed by the image")
    if said["host"] in ("127.0.0.1", "localhost"):
        problems.append(f"{name}: listens on {said['host']}, unreachable from outside")
    published = [str(p).rsplit(":", 1)[-1] for p in service.get("ports", [])]
    if str(said["port"]) not in published:
        problems.append(f"{name}: port {said['port']} is not published")
    return problems


def test_the_compose_file_is_consistent(compose, dockerfile):
    assert compose_problems(compose, exposed_ports(dockerfile)) == []
    services = compose["services"]
    assert {"kafka", "topics", "tsi-0", "tsi-1", "gateway"} <= set(services)
    kind, gateway = parsed_command(services["gateway"])
    assert kind == "serve" and gateway["port"] == 8080 and len(gateway["metrics_urls"]) == 2
    assert services["kafka"]["image"] == "apache/kafka:4.1.1"
    assert "healthcheck" in services["kafka"]
    assert depends_on(services["topics"]) == {"kafka": "service_healthy"}
    kind, job = parsed_command(services["topics"])
    assert kind == "topics" and job["partitions"] == 4
    assert job["names"] == [
        "tsi.requests",
        "tsi.feedback",
        "tsi.selections",
        "tsi.dlq",
        "tsi.events.internal",
        "tsi.changelog",
    ]
    assert job["changelog"] == ("tsi.changelog", DEFAULT_SHARDS)
    for member in (0, 1):
        kind, settings = parsed_command(services[f"tsi-{member}"])
        assert kind == "run", settings
        assert (settings.members, settings.member) == (2, member)
        assert settings.topics.changelog == "tsi.changelog"
        assert settings.process_id is None and not settings.addresses
        assert settings.recovery_dir == Path("/var/lib/tsi/recovery")
        assert settings.brokers == ["kafka:9092"]


def test_the_compose_files_commands_are_tsi_commands(compose):
    """Each tsi service's command, parsed by the real command line with its environment;
    a command tsi refuses is reported with what tsi said."""
    services = compose["services"]
    for name in ("topics", "tsi-0", "tsi-1"):
        assert parsed_command(services[name])[0] != "refused", parsed_command(services[name])
    broken = copy.deepcopy(services["tsi-1"])
    broken["command"] = ["run", "--members", "2", "--member", "two"]
    kind, said = parsed_command(broken)
    assert kind == "refused" and "two" in said, said
    broken["command"] = ["run", "--members", "2", "--membr", "1"]
    assert parsed_command(broken)[0] == "refused"


def _compose_duplicate_member(doc):
    doc["services"]["tsi-1"]["command"] = ["run", "--members", "2", "--member", "0"]


def _compose_other_member_count(doc):
    doc["services"]["tsi-1"]["command"] = ["run", "--members", "3", "--member", "1"]


def _compose_third_member_missing(doc):
    for k in (0, 1):
        doc["services"][f"tsi-{k}"]["command"] = ["run", "--members", "3", "--member", str(k)]


def _compose_member_out_of_range(doc):
    doc["services"]["tsi-1"]["command"] = ["run", "--members", "2", "--member", "2"]


def _compose_a_cluster_member(doc):
    doc["services"]["tsi-0"]["environment"]["TSI_ADDRESSES"] = "tsi-0:2101;tsi-1:2101"


def _compose_shared_recovery(doc):
    volumes = doc["services"]["tsi-1"]["volumes"]
    volumes[volumes.index("tsi-1-recovery:/var/lib/tsi")] = "tsi-0-recovery:/var/lib/tsi"


def _compose_undeclared_volume(doc):
    del doc["volumes"]["tsi-1-recovery"]


def _compose_unknown_dependency(doc):
    doc["services"]["topics"]["depends_on"] = {"broker": {"condition": "service_healthy"}}


def _compose_missing_registry(doc):
    volumes = doc["services"]["tsi-0"]["volumes"]
    volumes[0] = "./experiments.toml:/etc/tsi/registry.toml:ro"


def _compose_unknown_variable(doc):
    doc["services"]["tsi-0"]["environment"]["TSI_PROCESS"] = "0"


def _compose_topic_never_created(doc):
    doc["services"]["tsi-0"]["environment"]["TSI_TOPIC_DLQ"] = "tsi.dead"


def _compose_wrong_bootstrap(doc):
    doc["services"]["tsi-0"]["environment"]["KAFKA_BOOTSTRAP_SERVERS"] = "kafka:29092"


def _compose_too_few_partitions(doc):
    doc["services"]["topics"]["command"] = ["topics", "create", "--partitions", "1"]


def _compose_no_topics_job(doc):
    doc["services"]["topics"]["command"] = ["topics", "check"]


def _compose_healthcheck_script(doc, old, new):
    test = doc["services"]["tsi-1"]["healthcheck"]["test"]
    assert old in test[3]
    doc["services"]["tsi-1"]["healthcheck"] = {"test": [*test[:3], test[3].replace(old, new)]}


def _compose_healthcheck_on_metrics(doc):
    _compose_healthcheck_script(doc, "/ready", "/metrics")


def _compose_healthcheck_on_a_fixed_port(doc):
    _compose_healthcheck_script(doc, "{os.environ['TSI_METRICS_PORT']}", "9108")


def _compose_no_healthcheck(doc):
    del doc["services"]["tsi-0"]["healthcheck"]


def _compose_healthcheck_in_a_shell(doc):
    doc["services"]["tsi-0"]["healthcheck"] = {"test": "curl -f http://127.0.0.1:9108/ready"}


def _gateway_command(doc, flag, value):
    command = doc["services"]["gateway"]["command"]
    command[command.index(flag) + 1] = value


def _compose_gateway_missing_a_member(doc):
    _gateway_command(doc, "--metrics-url", "http://tsi-0:9108/metrics")


def _compose_gateway_on_localhost(doc):
    _gateway_command(doc, "--host", "127.0.0.1")


def _compose_gateway_other_topic(doc):
    doc["services"]["gateway"]["environment"]["TSI_TOPIC_SELECTIONS"] = "tsi.answers"


def _compose_gateway_port_not_exposed(doc):
    _gateway_command(doc, "--port", "8081")


COMPOSE_MUTATIONS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "gateway reading one member's metrics": (_compose_gateway_missing_a_member, "--metrics-url"),
    "gateway on localhost": (_compose_gateway_on_localhost, "unreachable from outside"),
    "gateway on another topic": (_compose_gateway_other_topic, "not the members' topics"),
    "gateway port not exposed": (_compose_gateway_port_not_exposed, "8081 is not exposed"),
    "two members with index 0": (_compose_duplicate_member, "--member 0 is also tsi-0's"),
    "members disagreeing on their count": (_compose_other_member_count, "of [2, 3]"),
    "a member missing": (_compose_third_member_missing, "--members 2 and --member 0..1"),
    "a member index out of range": (_compose_member_out_of_range, "member 2 of 2"),
    "a member given cluster addresses": (_compose_a_cluster_member, "tsi refuses its command"),
    "shared recovery volume": (_compose_shared_recovery, "shares recovery volume"),
    "undeclared volume": (_compose_undeclared_volume, "tsi-1-recovery is not declared"),
    "unknown dependency": (_compose_unknown_dependency, "unknown service broker"),
    "registry file missing": (_compose_missing_registry, "cannot read registry"),
    "variable tsi run does not read": (_compose_unknown_variable, "does not read TSI_PROCESS"),
    "topic never created": (_compose_topic_never_created, "tsi.dead is never created"),
    "bootstrap on the host listener": (_compose_wrong_bootstrap, "no advertised listener"),
    "fewer partitions than members": (_compose_too_few_partitions, "1 partitions per topic"),
    "no topics job": (_compose_no_topics_job, "0 services run `tsi topics create`"),
    "healthcheck on /metrics": (
        _compose_healthcheck_on_metrics,
        "tsi-1: the healthcheck does not ask",
    ),
    "healthcheck on a fixed port": (
        _compose_healthcheck_on_a_fixed_port,
        "does not read TSI_METRICS_PORT",
    ),
    "no healthcheck": (_compose_no_healthcheck, "tsi-0: no healthcheck"),
    "healthcheck without python": (_compose_healthcheck_in_a_shell, "is not ['CMD', 'python'"),
}


@pytest.mark.parametrize("mutation", COMPOSE_MUTATIONS)
def test_the_compose_checker_catches(compose, dockerfile, mutation):
    mutate, expected = COMPOSE_MUTATIONS[mutation]
    broken = copy.deepcopy(compose)
    mutate(broken)
    problems = compose_problems(broken, exposed_ports(dockerfile))
    assert any(expected in p for p in problems), problems


def run_healthcheck(script: str, port: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TSI_METRICS_PORT": str(port)}
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_compose_healthcheck_passes_only_while_the_service_makes_progress(compose):
    script = healthcheck_script(compose["services"]["tsi-0"])
    assert script is not None
    now = [1000.0]
    readiness = Readiness(60.0, lambda: now[0])
    server, _ = serve_metrics(0, "127.0.0.1", readiness=readiness)
    port = server.server_port
    try:
        done = run_healthcheck(script, port)
        assert done.returncode == 1
        assert done.stderr == (
            "not ready: no epoch completed yet, started 0 s ago; no Kafka broker reached yet\n"
        )
        readiness.note_epoch()
        readiness.note_broker(True)
        done = run_healthcheck(script, port)
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout.startswith("ready: last epoch 0 s ago")
        now[0] += 61.0
        done = run_healthcheck(script, port)
        assert done.returncode == 1 and done.stderr.startswith("not ready: no epoch for 61 s")
    finally:
        server.shutdown()
        server.server_close()
    done = run_healthcheck(script, port)  # nothing listens any more
    assert done.returncode == 1
    assert done.stderr.startswith(f"http://127.0.0.1:{port}/ready: ")
    assert done.stderr.count("\n") == 1  # one line, no traceback


def test_compose_and_kubernetes_use_the_ports_the_image_exposes(compose, dockerfile):
    exposed = exposed_ports(dockerfile)
    sts = _statefulset(load_k8s())
    ports = {
        p["containerPort"]
        for c in sts["spec"]["template"]["spec"]["containers"]
        for p in c["ports"]
    }
    assert ports <= exposed  # members need no cluster port (the image's serves --addresses)
    for name in ("tsi-0", "tsi-1"):
        assert {int(p) for p in compose["services"][name]["expose"]} <= exposed
        published = {int(p.rsplit(":", 1)[1]) for p in compose["services"][name]["ports"]}
        assert published <= exposed
