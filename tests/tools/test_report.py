"""Reports that explain themselves: sentences exactly when they apply, the injected faults
beside the dead letters, counts on the bars, the per-user share of the best arm, the same
bytes for the same input, and an HTML page that a browser renders from disk."""

import base64
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest

from flows.service.instances.registry import Registry
from flows.tools.demo import injected, run_demo, served_log
from flows.tools.report import Injected, ServedLog, summarise, write_report
from flows.tools.report_data import windowed
from flows.tools.report_plots import allocation_figure, allocation_panels, dead_letters_figure
from flows.tools.report_render import png_size
from flows.tools.traffic import generate, registry_toml

SEED = 4
PLOTS = ("regret", "allocation", "feedback_delays", "dead_letters")
INSTALL = (
    "Chromium is needed to check that REPORT.html renders: `make chromium` (or "
    "`sudo apt-get install -y --no-install-recommends chromium`, Debian package chromium)"
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A small demo run, its report (with registry and injected faults) and its parts."""
    registry = Registry.from_toml(registry_toml(seed=SEED))
    loop = run_demo(generate(n_requests=3000, seed=SEED), registry)
    stream, faults = served_log(loop), injected(loop)
    out = tmp_path_factory.mktemp("report")
    write_report(stream, out, "tsi demo report", ["a note"], registry=registry, injected=faults)
    return loop, stream, faults, registry, out


def _fault(faults: Injected, what: str) -> int:
    return {f.what: f.count for f in faults.faults}[what]


def _sentences(markdown: str, start: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith(start)]


def test_the_injected_fault_counts_are_what_the_demo_sent(demo):
    loop, _, faults, registry, out = demo
    truth = loop.demo.truth
    events = [_json(raw) for raw in loop.sent]
    feedback = [e for e in events if e.get("type") == "feedback"]
    answered = Counter(e["request_id"] for e in feedback)
    first = {}
    for e in feedback:
        first.setdefault(e["request_id"], e["ts"])
    served = {s["request_id"] for s in loop.selections}
    late = sum(
        1 for rid, ts in first.items() if ts - truth[rid][1] > registry[truth[rid][0]].feedback_ttl
    )
    broken = [raw for raw in loop.demo.events if not _ids(raw, truth)]
    assert _fault(faults, "feedback never sent (lost)") == len(served - set(answered))
    assert _fault(faults, "feedback sent twice") == sum(n - 1 for n in answered.values())
    assert _fault(faults, "feedback later than its experiment's TTL") == late
    assert _fault(faults, "feedback delayed (all of it; see the delay plot)") == len(feedback)
    assert sum(f.count for f in faults.faults if f.what.startswith("broken")) == len(broken) == 4
    # what the service dead-letters for broken messages and duplicates is exactly that
    dead = Counter(d["reason"] for d in loop.dead_letters)
    for reason in ("malformed_json", "unknown_experiment", "missing_field", "duplicate_feedback"):
        assert dead[reason] == faults.expected(reason) > 0, reason
    report = (out / "REPORT.md").read_text()
    for f in faults.faults:
        assert f"| {f.what} | {f.count:,} |" in report
    assert f"| duplicate_feedback | {dead['duplicate_feedback']:,} |" in report


def _json(raw: bytes) -> dict:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}  # one of the broken messages


def _ids(raw: bytes, truth: dict) -> list[bytes]:
    """The demo request ids a raw message names (none for a broken message)."""
    found = re.findall(rb'"request_id":\s*"([^"]+)"', raw)
    return [rid for rid in found if rid.decode() in truth]


def test_the_negative_regret_sentence_appears_exactly_for_the_negative_numbers(demo):
    _, stream, _, _, out = demo
    report = (out / "REPORT.md").read_text()
    for name in stream.experiments():
        negative = summarise(stream, name).regret_vs_best_fixed_arm < 0
        said = _sentences(report, f"`{name}`: the regret against the best fixed arm is negative")
        assert len(said) == int(negative), name
    said = " ".join(_sentences(report, "`"))
    # 3,000 requests: the per-user bandits of homepage are still learning; checkout's
    # best arm changed at 60% and the bandit followed
    assert "`checkout`: the regret against the best fixed arm is negative" in said
    assert "the best arm changes once during the stream" in said


def _stream(best_changes: bool, per_user: bool = False) -> ServedLog:
    """200 requests, 2 arms; the policy plays the best arm of each request; the best arm
    is arm 0 throughout, or arm 0 and then arm 1 (by time, or by user)."""
    selections, truth, ts = [], {}, {}
    for i in range(200):
        second = best_changes and (i % 2 if per_user else i >= 100)
        mu = np.array([0.8, 0.2]) if second else np.array([0.2, 0.8])
        arm, unit, rid = int(mu.argmin()), f"u{i % 2}" if per_user else None, f"r{i}"
        selections.append(
            {"experiment": "e", "unit": unit, "request_id": rid, "arm": arm, "arm_name": "ab"[arm]}
        )
        truth[rid], ts[("e", unit, rid)] = mu, float(i)
    letters = [{"reason": "malformed_json"}] * 3 + [{"reason": "ticket_expired"}] * 120
    return ServedLog(selections, [], letters, ts, truth)


def test_no_explanation_where_none_applies(tmp_path):
    write_report(_stream(best_changes=False), tmp_path / "fixed", "t", [])
    report = (tmp_path / "fixed" / "REPORT.md").read_text()
    assert "is negative" not in report and "(one bandit per user)" not in report
    assert "Injected faults: not known" in report  # nobody said what was injected
    assert "The algorithm variant is not known" in report
    assert "| ticket_expired | 120 |" in report and "Expected from" not in report
    write_report(_stream(best_changes=True), tmp_path / "moving", "t", [])
    report = (tmp_path / "moving" / "REPORT.md").read_text()
    assert "`e`: the regret against the best fixed arm is negative (-60.0)" in report
    assert "the best arm changes once during the stream (at 50% of its requests)" in report
    assert "(one bandit per user)" not in report
    write_report(_stream(best_changes=True, per_user=True), tmp_path / "users", "t", [])
    report = (tmp_path / "users" / "REPORT.md").read_text()
    assert "`e`: the regret against the best fixed arm is negative (-60.0)" in report
    assert "the users have different best arms (`a`, `b` are each the best" in report
    assert "`e` (one bandit per user): 100.0% of its requests went to that user's best" in report


def test_every_bar_of_the_dead_letter_chart_carries_its_count(demo):
    _, stream, _, _, _ = demo
    fig = dead_letters_figure(stream)
    ax = fig.axes[0]
    counts = Counter(d["reason"] for d in stream.dead_letters)
    reasons = [t.get_text() for t in ax.get_yticklabels()]
    labels = [t.get_text() for t in ax.texts]
    assert len(reasons) == len(counts) == len(labels) >= 5
    assert labels == [f"{counts[r]:,}" for r in reasons]
    assert [counts[r] for r in reasons] == sorted(counts.values(), reverse=True)


def test_the_per_user_plot_is_the_share_of_each_users_best_arm(demo):
    _, stream, _, _, _ = demo
    panels = {p.experiment: p for p in allocation_panels(stream, windows=20)}
    assert panels["checkout"].kind == panels["push"].kind == "arms"
    homepage = panels["homepage"]
    assert homepage.kind == "best_arm_share" and homepage.baseline == 0.25
    served = stream.served("homepage")
    hits = [
        float(stream.truth[s["request_id"]].argmin() == s["arm"]) for s in served
    ]  # each user's favourite is the single arm of lowest expected loss
    (share,) = homepage.series.values()
    assert np.allclose(share, windowed(np.array(hits), 20)[1])
    ax = allocation_figure(stream, windows=20).axes[1]
    assert "best arm" in ax.get_title()
    assert np.allclose(ax.lines[0].get_ydata(), share)


def test_the_same_input_gives_the_same_bytes(demo, tmp_path):
    loop, _, faults, registry, out = demo
    again = tmp_path / "again"
    write_report(
        served_log(loop), again, "tsi demo report", ["a note"], registry=registry, injected=faults
    )
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert {"REPORT.md", "REPORT.html", *(f"{p}.png" for p in PLOTS)} <= set(names)
    for name in names:
        assert (out / name).read_bytes() == (again / name).read_bytes(), name
    assert str(out) not in (out / "REPORT.html").read_text()


def test_the_html_is_one_self_contained_file(demo):
    _, _, _, _, out = demo
    page = (out / "REPORT.html").read_text()
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page and "<link" not in page and "url(" not in page
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == len(PLOTS)
    for src, name in zip(sources, PLOTS, strict=True):
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]) == (out / f"{name}.png").read_bytes()
    assert "<h2>Dead letters and injected faults</h2>" in page


def _chromium() -> str:
    found = shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )
    if found is None:
        pytest.fail(INSTALL, pytrace=False)
    return found


PROBE = (
    '<script>addEventListener("load", () => { for (const img of document.images) '
    'img.setAttribute("data-decoded", img.complete && img.naturalWidth > 0 ? '
    'img.naturalWidth + "x" + img.naturalHeight : "no"); '
    'document.body.setAttribute("data-probe", "ran"); });</script>'
)


def test_the_html_renders_in_headless_chromium(demo, tmp_path):
    """Every image decodes at its PNG's size in a real browser, opened from disk."""
    chromium = _chromium()
    _, _, _, _, out = demo
    page = (out / "REPORT.html").read_text()
    probe = tmp_path / "probe.html"  # the report stays script-free; its copy gets a probe
    probe.write_text(page.replace("</body>", PROBE + "</body>"))
    command = [
        *(chromium, "--headless", "--no-sandbox", "--disable-gpu"),
        *("--disable-background-networking", "--disable-component-update", "--disable-sync"),
        *("--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"),
        *("--dump-dom", probe.as_uri()),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert 'data-probe="ran"' in dom, dom[:500]
    decoded = re.findall(r'data-decoded="([^"]*)"', dom)
    sizes = [png_size((out / f"{name}.png").read_bytes()) for name in PLOTS]
    assert decoded == [f"{w}x{h}" for w, h in sizes]
    assert "<h1>tsi demo report</h1>" in dom and "ticket_expired" in dom


@pytest.mark.parametrize(
    "line",
    [
        b'{"type":"request","experiment":"a","request_id":["x"],"ts":1}',
        b'{"type":"request","experiment":"a","request_id":{"x":1},"ts":1}',
        b'{"type":"request","experiment":"a","request_id":"r","unit":7,"ts":1}',
        b'{"type":"request","experiment":"a","request_id":"r","ts":"soon"}',
        b'{"type":"feedback","experiment":"a","request_id":"r","ts":"x","loss":"1"}',
        b'{"type":"feedback","experiment":"a","request_id":"r","loss":1,"reward":2}',
    ],
)
def test_lines_the_service_refuses_do_not_reach_the_report(line, tmp_path):
    """Ids of another JSON type, a ts or a loss that is not a number: the service's dead
    letters; the report reads around them and is written."""
    from flows.service.wire.events import Origin
    from flows.tools.report_data import log_events

    good = b'{"type":"request","experiment":"a","request_id":"ok","ts":1}'
    request_ts, feedback = log_events([(line, Origin("f")), (good, Origin("f"))])
    assert request_ts == {("a", None, "ok"): 1} and feedback == []
    sel = [{"experiment": "a", "unit": None, "request_id": "ok", "arm": 0, "arm_name": "x"}]
    assert write_report(ServedLog(sel, feedback, [], request_ts), tmp_path, "t", []).is_file()
