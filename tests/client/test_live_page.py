"""The live page as a product manager meets it: ``tsi serve`` in front of ``tsi run`` on
the real broker, decisions and feedback through the gateway, then ``/experiments`` loaded
in headless Chromium: its numbers are the service's metrics, a screenshot is taken."""

import re
import subprocess
import time

from prometheus_client.parser import text_string_to_metric_families
from pytest import approx

from flows.testing.kafka_broker import free_port
from flows.tools.report_render import png_size
from tests.client.service import post
from tests.client.test_gateway import serve
from tests.service.test_first_hour import scrape
from tests.tools.test_report import _chromium
from tests.waiting import wait_for

EVERY = 1.0


def chromium(*args, profile):
    command = [
        *(_chromium(), "--headless", "--no-sandbox", "--disable-gpu"),
        *("--disable-background-networking", "--disable-component-update", "--disable-sync"),
        *("--no-first-run", f"--user-data-dir={profile}", *args),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def value(text, name, **labels):
    """A sample of a scrape (0 when absent), read by prometheus_client's parser."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def on_page(dom, experiment, pattern):
    """The values of ``pattern``'s group in the section of ``experiment``."""
    pattern_of_section = rf'<section data-experiment="{experiment}"[^>]*>(.*?)</section>'
    [section] = re.findall(pattern_of_section, dom, re.S)
    return re.findall(pattern, section)


def test_the_live_page_shows_the_service_metrics_in_a_browser(service, tmp_path):
    down = f"http://127.0.0.1:{free_port()}/metrics"  # a process of the cluster away
    proc, port = serve(
        *service.options, "--decide-timeout", "20", "--live-every", EVERY,
        "--metrics-url", f"http://127.0.0.1:{service.metrics_port}/metrics",
        "--metrics-url", down,
    )  # fmt: skip
    try:
        applied = 'tsi_feedback_total{experiment="shop",outcome="applied"}'
        before = service.metric(applied)
        for i in range(24):
            status, decision = post(port, "/v1/decide", {"experiment": "shop", "unit": f"u{i}"})
            assert status == 200, decision
            if i < 16:
                loss = {"a": 0.2, "b": 0.5, "c": 0.9}[decision["arm_name"]]
                fed = {"experiment": "shop", "request_id": decision["request_id"], "loss": loss}
                assert post(port, "/v1/feedback", fed)[0] == 202
        floor = 'tsi_feedback_total{experiment="floor",outcome="applied"}'
        floored = service.metric(floor)
        for _ in range(12):  # fed rewards, with a min_share floor
            status, decision = post(port, "/v1/decide", {"experiment": "floor"})
            assert status == 200, decision
            reward = float(decision["arm_name"] == "good")
            fed = {"experiment": "floor", "request_id": decision["request_id"], "reward": reward}
            assert post(port, "/v1/feedback", fed)[0] == 202
        wait_for(lambda: service.metric(applied) == before + 16, service.proc, 30, "feedback")
        wait_for(lambda: service.metric(floor) == floored + 12, service.proc, 30, "rewards")
        time.sleep(1.2)  # the shared instance's q is read again after the next event
        assert post(port, "/v1/decide", {"experiment": "shop", "unit": "last"})[0] == 200
        assert post(port, "/v1/decide", {"experiment": "floor"})[0] == 200
        time.sleep(3 * EVERY)  # the gateway samples the settled metrics
        text = scrape(service.metrics_port)[1]
        url = f"http://127.0.0.1:{port}/experiments"
        dom = chromium("--dump-dom", url, profile=tmp_path / "dom")
        assert _same_numbers(text, scrape(service.metrics_port)[1])  # settled meanwhile
        shot = tmp_path / "experiments.png"
        chromium(f"--screenshot={shot}", "--window-size=1200,1400", url, profile=tmp_path / "s")
    finally:
        proc.kill()
        proc.wait()
    assert "<h1>Experiments, live</h1>" in dom
    for arm in "abc":
        labels = {"experiment": "shop", "arm": arm}
        for attribute, name in (("selections", "tsi_arm_selections_total"), ("q", "tsi_arm_share")):
            shown = on_page(dom, "shop", rf'<tr data-arm="{arm}">.*?data-{attribute}="([^"]*)"')
            assert [float(x) for x in shown] == [value(text, name, **labels)], (arm, attribute)
    assert sum(float(x) for x in on_page(dom, "shop", r'data-q="([^"]*)"')) == approx(1.0)
    _served_and_rewards(dom, text)
    for outcome in ("applied", "early", "duplicate"):
        labels = {"experiment": "shop", "outcome": outcome}
        shown = on_page(dom, "shop", rf'data-outcome="{outcome}" data-count="([^"]*)"')
        want = value(text, "tsi_feedback_total", **labels)
        assert [float(x) for x in shown] == ([want] if want else []), outcome
    assert value(text, "tsi_feedback_total", experiment="shop", outcome="applied") >= 16
    decisions = on_page(dom, "shop", r'data-decisions="([^"]*)"')
    assert [float(x) for x in decisions] == [value(text, "tsi_decisions_total", experiment="shop")]
    assert 'data-chart="q"' in dom  # the shared instance's q over time
    assert f'data-endpoint="{down}" data-up="0"' in dom
    assert f'data-endpoint="http://127.0.0.1:{service.metrics_port}/metrics" data-up="1"' in dom
    width, height = png_size(shot.read_bytes())
    assert (width, height) == (1200, 1400) and shot.stat().st_size > 20_000


def _served_and_rewards(dom, text):
    """The new columns: each arm's served chance beside its q (the min_share floor of
    "floor" serves every arm at 30% or more), and "floor", fed rewards, read as rewards."""
    for name in ("Learner's q now", "Served now"):
        assert f"<th>{name}</th>" in dom
    for experiment, arms in (("shop", "abc"), ("floor", ("good", "bad"))):
        for arm in arms:
            labels = {"experiment": experiment, "arm": arm}
            shown = on_page(dom, experiment, rf'<tr data-arm="{arm}">.*?data-served="([^"]*)"')
            assert [float(x) for x in shown] == [value(text, "tsi_arm_served_share", **labels)]
    served = [float(x) for x in on_page(dom, "floor", r'data-served="([^"]*)"')]
    assert sum(served) == approx(1.0) and min(served) >= 0.3 - 1e-9
    [kind] = re.findall(r'<section data-experiment="floor" data-outcome-kind="(\w+)"', dom)
    assert kind == "reward" and on_page(dom, "floor", r"(Mean reward) \(95% interval\)")
    assert on_page(dom, "floor", r'data-mean-reward="([^"]+)"')
    assert on_page(dom, "shop", r"(Mean loss) \(95% interval\)")


def _same_numbers(first, second):
    """The tsi_ selection and feedback samples of two scrapes are equal."""
    keep = (
        "tsi_arm_selections_total",
        "tsi_feedback_total",
        "tsi_decisions_total",
        "tsi_arm_share",
        "tsi_arm_served_share",
        "tsi_feedback_given_total",
    )
    lines = [
        sorted(line for line in t.splitlines() if line.startswith(keep)) for t in (first, second)
    ]
    return lines[0] == lines[1]
