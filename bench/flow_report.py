"""The Markdown report of ``bench_flow.py`` and the machine it ran on."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import bytewax
import confluent_kafka
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this one
import flow_references
from flow_kafka import Broker
from flow_plan import (
    HEADLINE_LATENCY,
    N_ARMS,
    ROOT,
    TARGET_BYTES_PER_INSTANCE,
    TARGET_P99_MS,
    TARGET_REFERENCE_RATIO,
    WARM_UNITS,
)
from flow_throughput import LADDER, MEASURES, hops_of


def machine_info(bk: Broker) -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "flows", "tsi_core"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    return {
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "memory_gib": psutil.virtual_memory().total / 2**30,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "bytewax": getattr(bytewax, "__version__", None) or _version("bytewax"),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "kcat": flow_references.kcat_version(),
        "broker": (
            "project broker, deploy/kafka (Kafka 4.1.1, single node), started by this run"
            if bk.started_here
            else f"external, KAFKA_BOOTSTRAP_SERVERS={bk.bootstrap}"
        ),
        "load_average_at_start": os.getloadavg(),
        "git_commit": commit,
        "uncommitted_files_in_flows_tsi_core": len([x for x in dirty if x.strip()]),
    }


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def fmt_load(load: Iterable[float]) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


MODES = (("separate", "requests + feedback topics"), ("events", "events topic"))
MEMORY_STATES = (("open_tickets", "open ticket"), ("idle", "idle"), ("seasoned", "seasoned idle"))
REFERENCE_TEXT = {
    "python_1": "Python (confluent-kafka, one thread), one hop",
    "kcat_1": "C: kcat consuming, grep, kcat producing (three processes), one hop",
    "python_2": "Python, two hops (internal topic; both stages in one thread, at once)",
    "kcat_2": "C: kcat, two hops (two pipelines at once)",
}


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def report_machine(results: dict[str, Any]) -> list[str]:
    """Title and the machine, code and workload of the run."""
    m, plan = results["machine"], results["plan"]
    return [
        "# Streaming service benchmark (bench/bench_flow.py)",
        "",
        f"- CPU: {m['cpu_model']} ({m['cpu_count']} logical, {m['usable_cpus']} usable), "
        f"{m['memory_gib']:.0f} GiB RAM; {m['platform']}",
        f"- Python {m['python']}, Bytewax {m['bytewax']}, confluent-kafka "
        f"{m['confluent_kafka']} (librdkafka {m['librdkafka']}); kcat: {m['kcat']}",
        f"- Broker: {m['broker']}; broker, service and load generator share the machine",
        f"- Code: git {m['git_commit']} ({m['uncommitted_files_in_flows_tsi_core']} uncommitted "
        "files in flows/ and tsi_core/)",
        f"- Mode: {plan['mode']}; {results['wall_seconds']:.0f} s in all; command: "
        f"`{results['command']}`",
        f"- Workload: one per-unit experiment, {N_ARMS} arms; one process, one worker",
        f"- Load average (1, 5, 15 min) at start {fmt_load(m['load_average_at_start'])}, at end "
        f"{fmt_load(results['load_average_at_end'])} (other jobs on the machine skew figures)",
        "",
    ]


def fmt_spread(s: dict[str, Any], digits: int = 0) -> str:
    """``median (min - max)`` of every run."""
    if digits:
        return f"{s['median']:.{digits}f} ({s['min']:.{digits}f} - {s['max']:.{digits}f})"
    return f"{s['median']:,.0f} ({s['min']:,.0f} - {s['max']:,.0f})"


def report_throughput(tp: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """The references, then every measure with its ratios to the references of its hops."""
    n = plan["requests"]
    modes = [(mode, label) for mode, label in MODES if tp.get(mode)]
    repeats = len(tp[modes[0][0]]["runs"]) if modes else 0
    lines = [
        f"## Throughput, end to end ({n:,} requests + {n:,} feedback, {plan['units']:,} "
        f"units; {repeats} repeats, every run counted)",
        "",
        "Every figure is steady events/s: input events over the time from the first answer "
        "to the last (their Kafka timestamps), the median of every repeat's run (min - max). "
        "In each repeat the references and the service's setups run once each, in turn. The "
        "references do the service's work (`bench/flow_references.py`): every request and "
        "feedback event consumed, one answer written per request, pipelined.",
        "",
        "| Reference | " + " | ".join(label for _, label in modes) + " |",
        "|---|" + "---:|" * len(modes),
    ]
    for key, text in REFERENCE_TEXT.items():
        cells = [
            fmt_spread(tp[mode]["rates"][key]) if key in tp[mode]["rates"] else "-"
            for mode, _ in modes
        ]
        lines.append(f"| {text} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Each setup against the references of as many Kafka hops (the default two-topic "
        "setup crosses its internal topic: two); ratios are the median of the repeats' "
        "ratios (each repeat's run over the same repeat's reference), min - max. Target: "
        f">= {TARGET_REFERENCE_RATIO:g} of the Python reference (the kcat ratio has no "
        "target: it says how far the service is from what the broker and librdkafka carry).",
        "",
        "| Setup | Input | Hops | events/s | / Python reference | Target | | / kcat |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for key, text, _ in MEASURES:
        for mode, label in modes:
            hops = hops_of(mode, key)
            py = tp[mode]["ratios"][f"{key}/python_{hops}"]
            kc = tp[mode]["ratios"][f"{key}/kcat_{hops}"]
            ok = py["median"] >= TARGET_REFERENCE_RATIO
            target = (  # the target is the service's; a ladder's rung is a diagnostic
                "- | -" if key in LADDER else f">= {TARGET_REFERENCE_RATIO:g} | {verdict(ok)}"
            )
            head = "**headline** " if key == "deployed_recovery" else ""
            lines.append(
                f"| {head}{text} | {label} | {hops} | {fmt_spread(tp[mode]['rates'][key])} | "
                f"{fmt_spread(py, 2)} | {target} | {fmt_spread(kc, 2)} |"
            )
    return lines + throughput_notes(tp, modes)


def throughput_notes(tp: dict[str, Any], modes: list[tuple[str, str]]) -> list[str]:
    """The bounded run's CPU, the ladder's CPU an event, the short epoch, clean runs."""
    lines = [""]
    for mode, label in modes:
        r = tp[mode]
        mid = r["runs"][len(r["runs"]) // 2]
        lines.append(
            f"- {label}, the bounded run (`run_main`): {r['seconds']:.2f} s start to EOF "
            f"(raw {r['raw_events_per_s']:,.0f} events/s); worker thread "
            f"{r['worker_us_per_event']:.1f} us an event (stack {r['stack_us_per_event']:.1f}, "
            f"shape {r['shape_us_per_event']:.1f}); in the middle repeat the worker thread "
            f"used {pct(mid['worker_thread_cpu'])} of a core, the process "
            f"{pct(mid['process_cpu'])}, the broker {pct(mid['broker_cpu'])}."
        )
    short = tp.get("separate_short_epoch")
    if short:
        lines.append(
            f"- Two topics read directly, epoch {short['epoch_ms']:g} ms (1 run, bounded): "
            f"{short['steady_events_per_s']:,.0f} events/s steady."
        )
    all_runs = [r for mode, _ in modes for r in tp[mode]["runs"]]
    clean = all(
        r["dead_letters"] == 0
        and 2 * r["selections"] == r["events"]
        and not r["deployed_dead_letters"]
        for r in all_runs
    )
    lines += [
        "- Every run answered every request with no dead letter: "
        + ("yes." if clean else "NO (see JSON)."),
        "",
    ]
    return lines


def by_config(lat: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The runs of each configuration, in the order first run."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in lat:
        out.setdefault(r["config"]["name"], []).append(r)
    return out


def latency_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over the runs of each percentile, every run's p99, and the verdict (on
    the median p99; how many runs met the target alone)."""
    med = {k: statistics.median(r[k] for r in runs) for k in LATENCY_KEYS}
    p99s = [r["p99_ms"] for r in runs]
    return {
        **med,
        "p99_runs": p99s,
        "runs_meeting_target": sum(p <= TARGET_P99_MS for p in p99s),
        "answered": sum(r["answered"] for r in runs),
        "sent": sum(r["sent"] for r in runs),
        "ok": med["p99_ms"] <= TARGET_P99_MS,
    }


LATENCY_KEYS = (
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "p99_9_ms",
    "max_ms",
    "closed_loop_p99_ms",
    "sender_max_lag_ms",
)


def report_latency(lat: list[dict[str, Any]], plan: dict[str, Any]) -> list[str]:
    """The latency table, one row per configuration (medians over its runs)."""
    lines = [
        f"## Decision latency, open loop, at {plan['latency_rate']:,.0f} requests/s for "
        f"{plan['latency_seconds']:g} s (after {plan['latency_warmup_seconds']:g} s warm-up "
        "at the same load)",
        "",
        "Request k is due at t0 + k / rate; latency = the answer's arrival - the request's "
        "intended send time, so a sender that falls behind is counted (`bench/open_loop.py`); "
        "an unanswered request counts as infinitely slow; nearest-rank percentiles in ms. "
        "Each figure is the median over the configuration's runs (configurations with "
        "several runs ran in rounds, alternating). `closed loop p99` is the p99 from the "
        "actual send, what a closed-loop generator would report; `sender lag` the most a "
        "request went out after its intended time. The headline is the configuration users "
        "run: `tsi run --recovery-dir DIR` (snapshots every 10 s).",
        "",
        "| Service | Epoch | Feedback | Runs | Answered | p50 | p90 | p99 | p99 of each run | "
        f"p99.9 | max | closed loop p99 | sender lag | Target p99 <= {TARGET_P99_MS:g} | |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, runs in by_config(lat).items():
        c, s = runs[0]["config"], latency_summary(runs)
        fb = f"{runs[0]['rate']:,.0f}/s, 0.5 s later" if c["feedback"] else "none"
        head = "**headline** " if name == HEADLINE_LATENCY.name else ""
        each = ", ".join(f"{p:.1f}" for p in s["p99_runs"])
        lines.append(
            f"| {head}`{name.replace(', + feedback', '')}` | {c['epoch']} | {fb} | {len(runs)} | "
            f"{s['answered']:,} / {s['sent']:,} | {s['p50_ms']:.1f} | {s['p90_ms']:.1f} | "
            f"{s['p99_ms']:.1f} | {each} | {s['p99_9_ms']:.1f} | {s['max_ms']:.1f} | "
            f"{s['closed_loop_p99_ms']:.1f} | {s['sender_max_lag_ms']:.1f} | "
            f"<= {TARGET_P99_MS:g} | {verdict(s['ok'])} ({s['runs_meeting_target']} of "
            f"{len(runs)} runs) |"
        )
    return lines + latency_slow_seconds(lat)


def latency_slow_seconds(lat: list[dict[str, Any]]) -> list[str]:
    """Per run, the seconds whose slowest answer took over 100 ms."""
    lines = [
        "",
        "Seconds (since the service process started; requests due in that second) whose "
        "slowest answer took over 100 ms:",
        "",
    ]
    for r in lat:
        slow = [f"{sec} s: {worst:.0f} ms" for sec, _, _, _, worst in r["timeline"] if worst > 100]
        gcs = r["gc2_pauses_ms"]
        gc_note = (
            ""
            if gcs is None
            else f"; full GCs in the service: {len(gcs)}"
            + (f", longest {max(gcs):.0f} ms" if gcs else "")
        )
        lines.append(
            f"- `{r['config']['name']}` run {r['round']} (measured from "
            f"{r['measured_from_s']:.1f} s): " + (", ".join(slow) if slow else "none") + gc_note
        )
    lines.append("")
    return lines


def report_memory(mem: dict[str, Any]) -> list[str]:
    """The RSS table, one row per stage and state: at rest and the peak."""
    lines = [
        "## Memory per instance (RSS of the service process)",
        "",
        (
            "`tsi run --recovery-dir DIR` (recovery and its changelog on"
            if mem.get("recovery", False)
            else "`python -m bytewax.run flows.service.main:flow` (no recovery"
        )
        + ", epoch 10 s); new units in cumulative stages; "
        f"baseline = RSS after {WARM_UNITS} warm-up instances. Open ticket: one "
        "request per unit, the selection waits for its feedback (TTL 3600 s). Idle: request "
        "then feedback on the events topic with feedback_ttl = 1 s, RSS read once the "
        "settled answers have expired, so only the instance (bandit state) remains. Seasoned "
        "idle: the same, 20 rounds per unit (round by round, losses that differ), so the "
        "arms have had gaps, as a long-lived user's have. At rest: "
        "the RSS 12 s after the stage's last answer; peak: the process's VmHWM (the most it "
        "ever held), both over the same baseline.",
        "",
        "| Instances | State | Baseline (MiB) | RSS at rest (MiB) | Peak RSS (MiB) | "
        "at rest: (RSS - baseline) / instances (B) | peak: (VmHWM - baseline) / instances "
        "(B) | New instances/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, label in MEMORY_STATES:
        run = mem.get(key)
        for st in run["stages"] if run else ():
            lines.append(
                f"| {st['instances']:,} | {label} | {mib(run['baseline_rss'])} | "
                f"{mib(st['rss'])} | {mib(st['hwm'])} | {st['bytes_per_instance']:,.0f} | "
                f"{st['peak_bytes_per_instance']:,.0f} | {st['new_instances_per_s']:,.0f} |"
            )
    lines.append("")
    return lines + memory_notes(mem)


def seasoned_note(mem: dict[str, Any]) -> list[str]:
    """What a long-lived user's instance holds beyond a first-loss one: seasoned idle over
    idle at the seasoned run's stage (the same number of instances, the same run)."""
    seasoned, idle = mem.get("seasoned"), mem.get("idle")
    if not (seasoned and idle):
        return []
    last = seasoned["stages"][-1]
    same = [st for st in idle["stages"] if st["instances"] == last["instances"]]
    if not same:
        return []
    rest = last["bytes_per_instance"] - same[0]["bytes_per_instance"]
    peak = last["peak_bytes_per_instance"] - same[0]["peak_bytes_per_instance"]
    return [
        f"- seasoned idle over idle at {last['instances']:,} instances: {rest:+,.0f} B per "
        f"instance at rest, {peak:+,.0f} B at the peak (what a long-lived user's instance "
        "holds beyond one that has had its first loss only)."
    ]


def memory_notes(mem: dict[str, Any]) -> list[str]:
    """Verdict per state (at rest and at the peak), then the Python and Bytewax
    decompositions."""
    lines = []
    for key, label in MEMORY_STATES:
        run = mem.get(key)
        if not run:
            continue
        last = run["stages"][-1]
        target = TARGET_BYTES_PER_INSTANCE[key]
        rest, peak = last["bytes_per_instance"], last["peak_bytes_per_instance"]
        lines.append(
            f"- {label}, {last['instances']:,} instances: at rest {rest:,.0f} B per instance "
            f"(least-squares slope {run['slope_bytes_per_instance']:,.0f} B), peak "
            f"{peak:,.0f} B; target <= {target:,} B for the peak: **{verdict(peak <= target)}** "
            f"(at rest: {verdict(rest <= target)}); dead letters: {run['dead_letters']}."
        )
    b, floor = mem["python_breakdown"], mem["bytewax_floor"]
    return [
        *lines,
        *seasoned_note(mem),
        f"- Python objects of one `Instance` alone (tracemalloc, 10,000 instances, in this "
        f"process, without Bytewax's per-key state): open ticket {b['open_ticket']:,.0f} B, "
        f"settled (answer kept for the TTL) {b['settled']:,.0f} B, idle after expiry "
        f"{b['idle_after_expiry']:,.0f} B.",
        f"- Bytewax's own state per key (`op.stateful` with a logic that keeps nothing, "
        f"{floor['keys']:,} keys, RSS, `bench/flow_helpers.py floor`): "
        f"{floor['bytes_per_key']:,.0f} B.",
        "",
    ]


def report_profile(prof: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """Own time by group, then the top functions."""
    lines = [
        f"## Profile (cProfile, requests + feedback topics, {plan['requests'] * 2:,} events)",
        "",
        f"Profiled run {prof['profiled_seconds']:.1f} s vs {prof['unprofiled_seconds']:.1f} s "
        "unprofiled: cProfile inflates Python calls more than C calls, so shares of Python "
        "code are upper bounds. Own time (tottime) by group; built-ins and generated code "
        "count for their callers.",
        "",
        "| Group | Seconds | Share | µs per event (profiled) |",
        "|---|---:|---:|---:|",
    ]
    for g, v in sorted(prof["groups"].items(), key=lambda kv: -kv[1]["seconds"]):
        lines.append(
            f"| {g} | {v['seconds']:.2f} | {pct(v['share'])} | {prof['us_per_event'][g]:.1f} |"
        )
    lines += ["", "Top functions by own time:", "", "| Function | Group | Calls | Own s |"]
    lines.append("|---|---|---:|---:|")
    for t in prof["top"][:15]:
        lines.append(
            f"| `{t['function']}` | {t['group'].split(' (')[0]} | {t['calls']:,} | "
            f"{t['tottime_s']:.3f} |"
        )
    return lines + profile_notes(prof)


def profile_notes(prof: dict[str, Any]) -> list[str]:
    """Snapshot calls and the share of feedback that came before its request."""
    snap, to_dict = prof["snapshot"], prof["instance_to_dict"]
    lines = [""]
    if snap:
        lines.append(
            f"`ShardLogic.snapshot` was called {snap['calls']:,} times "
            f"({snap['cumtime_s']:.2f} s cumulative; `Instance.to_dict` "
            f"{(to_dict or {}).get('calls', 0):,} times) in a run without recovery."
        )
    if prof.get("early_feedback_share") is not None:
        lines.append(
            f"Feedback that arrived before its request (buffered, then applied): "
            f"{pct(prof['early_feedback_share'])}."
        )
    lines.append("")
    return lines


def report_errors(errors: dict[str, str]) -> list[str]:
    lines = ["## Errors", ""]
    for name, err in errors.items():
        lines += [f"- {name}:", "", "```", err.strip(), "```", ""]
    return lines


def report(results: dict[str, Any]) -> str:
    """The Markdown report: the machine, then a section per part that ran."""
    plan = results["plan"]
    lines = report_machine(results)
    if tp := results.get("throughput"):
        lines += report_throughput(tp, plan)
    if lat := results.get("latency"):
        lines += report_latency(lat, plan)
    if mem := results.get("memory"):
        lines += report_memory(mem)
    if prof := results.get("profile"):
        lines += report_profile(prof, plan)
    if errors := results.get("errors", {}):
        lines += report_errors(errors)
    return "\n".join(lines)
