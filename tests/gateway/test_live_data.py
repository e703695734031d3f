"""The live page's numbers and HTML from the service's real metrics text (a flow run in
memory, then ``generate_latest``), without network: the summary, two endpoints summed, an
endpoint down, the bounded history, hostile names escaped."""

import asyncio
import math
import re
import time

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY as METRICS
from prometheus_client import generate_latest

from flows.client import ClientSettings
from flows.gateway.app import gateway
from flows.gateway.live import Live
from flows.gateway.live_data import RECENT, History, Sample, summary
from flows.gateway.live_page import render
from flows.service.instances.registry import Registry
from flows.service.shards.logic import logic_builder
from flows.service.wire.events import Origin, parse_feedback
from flows.testing.kafka_broker import free_port
from tests.service.test_metrics import feedback, item, request

HOSTILE = '"><script>alert(1)</script>'
REGISTRY = Registry.from_toml(
    f"""
[experiments.live_shop]
arms = ["a", "b", {HOSTILE!r}]

[experiments.live_ctx]
arms = ["x", "y"]
contexts = {{ device = ["ios"] }}

[experiments.live_floor]
arms = ["good", "bad"]
min_share = 0.3
"""
)


def value(name: str, **labels: str) -> float:
    """A sample of the process's metrics, read straight from the registry."""
    found = METRICS.get_sample_value(name, labels)
    return 0.0 if found is None else found


@pytest.fixture(scope="module")
def text() -> str:
    """The metrics text of a run: requests and feedback for both experiments."""
    logic = logic_builder(REGISTRY, clock=lambda: 1000.0)(None)
    for i in range(40):
        logic.handle(item(logic, "live_shop", request(f"ls{i}", "live_shop")))
        context = {"device": "ios" if i % 2 else "web"}
        logic.handle(item(logic, "live_ctx", request(f"lc{i}", "live_ctx", context=context)))
    for i in range(39):
        logic.handle(item(logic, "live_shop", feedback(f"ls{i}", "live_shop", loss=i % 4 / 3)))
        logic.handle(item(logic, "live_ctx", feedback(f"lc{i}", "live_ctx", loss=i % 2)))
    for i in range(60):  # fed rewards: "good" converts, "bad" never
        [answer] = logic.handle(item(logic, "live_floor", request(f"lf{i}", "live_floor")))
        raw = orjson.dumps({"experiment": "live_floor", "request_id": f"lf{i}",
                            "reward": float(answer.arm_name == "good")})  # fmt: skip
        logic.handle(item(logic, "live_floor", parse_feedback(raw, Origin("t", 0, 9))))
    time.sleep(1.1)  # deliberate: past arm_metrics.SHARE_EVERY, the q is read on the next event
    logic.handle(item(logic, "live_floor", request("lf60", "live_floor")))
    logic.handle(item(logic, "live_shop", feedback("ls39", "live_shop", loss=0.0)))
    logic.handle(item(logic, "live_ctx", feedback("lc39", "live_ctx", loss=0.0)))
    return generate_latest().decode()


def experiment(data: dict, name: str) -> dict:
    [found] = [e for e in data["experiments"] if e["experiment"] == name]
    return found


def test_the_summary_has_the_metrics_numbers(text):
    history = History(every=10.0)
    history.add(Sample.of(1000.0, [("http://one/metrics", text)]))
    shop = experiment(summary(history), "live_shop")
    arms = {row["arm"]: row for row in shop["arms"]}
    assert set(arms) == {"a", "b", HOSTILE}
    total = sum(value("tsi_arm_selections_total", experiment="live_shop", arm=a) for a in arms)
    served = value("tsi_decisions_total", experiment="live_shop") - value(
        "tsi_retries_total", experiment="live_shop"
    )
    for arm, row in arms.items():
        labels = {"experiment": "live_shop", "arm": arm}
        selections = value("tsi_arm_selections_total", **labels)
        n = value("tsi_arm_feedback_total", **labels) + value("tsi_arm_defaulted_total", **labels)
        loss, squares = (
            value("tsi_arm_loss_sum", **labels),
            value("tsi_arm_loss_squares_sum", **labels),
        )
        assert row["selections"] == selections
        assert row["share"] == pytest.approx(selections / total)
        assert row["recent_share"] == pytest.approx(selections / total)  # one sample: all
        assert row["q"] == value("tsi_arm_share", **labels)
        assert row["ips_loss"] == pytest.approx(value("tsi_arm_ips_loss_sum", **labels) / served)
        if n:
            mean = loss / n
            assert row["mean_loss"] == pytest.approx(mean)
            half = 1.96 * math.sqrt(max(squares / n - mean**2, 0) / n)
            assert row["interval"] == pytest.approx(half)
    assert sum(row["q"] for row in arms.values()) == pytest.approx(1.0)
    outcomes = shop["feedback"]
    assert outcomes["applied"] == value(
        "tsi_feedback_total", experiment="live_shop", outcome="applied"
    )
    ctx = experiment(summary(history), "live_ctx")
    assert set(ctx["context_q"]) == {"device=ios", "device=other"}
    assert ctx["context_q"]["device=ios"]["x"] == value(
        "tsi_arm_context_share", experiment="live_ctx", context="device=ios", arm="x"
    )
    assert ctx["q_history"] == {}  # contextual: the latest by context, no chart


def test_two_endpoints_are_summed_and_q_is_not(text):
    history = History(every=10.0)
    history.add(Sample.of(1000.0, [("http://one/metrics", text), ("http://two/metrics", text)]))
    shop = experiment(summary(history), "live_shop")
    for row in shop["arms"]:
        labels = {"experiment": "live_shop", "arm": row["arm"]}
        assert row["selections"] == 2 * value("tsi_arm_selections_total", **labels)
        assert row["q"] == value("tsi_arm_share", **labels)


def test_an_endpoint_down_is_shown_down_and_the_others_still_count(text):
    history = History(every=10.0)
    down = ConnectionRefusedError(111, "Connection refused")
    history.add(Sample.of(1000.0, [("http://one/metrics", text), ("http://two/m", down)]))
    data = summary(history)
    assert data["endpoints"] == [
        {"url": "http://one/metrics", "up": True, "error": ""},
        {"url": "http://two/m", "up": False, "error": "[Errno 111] Connection refused"},
    ]
    page = render(data)
    assert 'data-endpoint="http://two/m" data-up="0"' in page and "Connection refused" in page
    assert experiment(data, "live_shop")["arms"]


def test_an_answer_that_is_not_prometheus_text_is_an_endpoint_down():
    sample = Sample.of(1.0, [("http://x/", "<html>oops</html>")])
    assert not sample.endpoints[0].up and "not Prometheus text" in sample.endpoints[0].error
    assert sample.samples == {}


def test_every_name_is_escaped(text):
    history = History(every=10.0)
    hostile_url = "http://h/<b>"
    history.add(Sample.of(1.0, [("http://one/metrics", text), (hostile_url, OSError("<i>"))]))
    page = render(summary(history))
    assert HOSTILE not in page and "<script>" not in page
    assert "&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert hostile_url not in page and "<i>" not in page
    assert "http://h/&lt;b&gt;" in page and "&lt;i&gt;" in page


def test_the_recent_share_is_over_the_last_samples():
    def sample(at, a, b):
        text = (
            f'tsi_arm_selections_total{{experiment="e",arm="a"}} {a}\n'
            f'tsi_arm_selections_total{{experiment="e",arm="b"}} {b}\n'
        )
        return Sample.of(at, [("u", text)])

    history = History(every=60.0)
    history.add(sample(0.0, 40, 0))
    history.add(sample(60.0, 50, 0))
    history.add(sample(RECENT, 100, 0))
    history.add(sample(RECENT + 60, 130, 10))
    [a, b] = experiment(summary(history), "e")["arms"]
    assert (a["share"], b["share"]) == (130 / 140, 10 / 140)
    # from the newest sample at least RECENT s before the latest: the one at 60 s
    assert (a["recent_share"], b["recent_share"]) == (80 / 90, 10 / 90)
    assert summary(history)["recent_seconds"] == RECENT


@settings(max_examples=25, deadline=None)
@given(st.floats(0.5, 100), st.floats(1, 500), st.integers(1, 300))
def test_the_history_is_bounded_and_keeps_the_last_points(every, keep_factor, n):
    keep = every * keep_factor
    history = History(every, keep)
    for i in range(n):
        history.add(Sample.of(i * every, [("u", f'tsi_arm_share{{experiment="e",arm="a"}} {i}')]))
    assert len(history.points) == min(n, math.ceil(keep / every) + 1)
    points = history.q_history()["e"]["a"]
    assert points[-1] == ((n - 1) * every, n - 1) and len(points) == len(history.points)


def test_bad_history_settings_are_refused():
    with pytest.raises(ValueError, match="every must be > 0"):
        History(every=0.0)


def test_the_routes_answer_with_an_endpoint_down_not_a_500():
    live = Live([f"http://127.0.0.1:{free_port()}/metrics"], every=0.2)
    asyncio.run(live.sample())
    app = gateway(ClientSettings(brokers="127.0.0.1:1"), live)

    async def get(path):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get(path)

    page, data = asyncio.run(get("/experiments")), asyncio.run(get("/experiments.json"))
    assert page.status_code == 200 and 'data-up="0"' in page.text
    assert data.status_code == 200 and data.json()["endpoints"][0]["up"] is False


def test_a_floored_arm_shows_its_served_chance_beside_q_and_rewards_read_as_rewards(text):
    """min_share serves "bad" at 30% while the learner's q gives it less; the experiment is
    fed rewards, so the page shows the mean reward (higher is better), not the loss."""
    history = History(every=10.0)
    history.add(Sample.of(1000.0, [("http://one/metrics", text)]))
    data = summary(history)
    floor, shop = experiment(data, "live_floor"), experiment(data, "live_shop")
    rows = {row["arm"]: row for row in floor["arms"]}
    for arm, row in rows.items():
        labels = {"experiment": "live_floor", "arm": arm}
        assert row["served"] == value("tsi_arm_served_share", **labels)
        assert row["q"] == value("tsi_arm_share", **labels)
    assert rows["bad"]["q"] < 0.3 <= rows["bad"]["served"] + 1e-12
    assert floor["rewards"] and not shop["rewards"]
    page = render(data)
    [section] = re.findall(r'<section data-experiment="live_floor".*?</section>', page, re.S)
    assert 'data-outcome-kind="reward"' in section and "Mean reward (95% interval)" in section
    assert "Higher reward is better" in section and "Mean loss" not in section
    good = rows["good"]
    assert f'data-mean-reward="{-good["mean_loss"]!r}"' in section and -good["mean_loss"] > 0
    assert 'data-mean-reward="0.0"' in section  # "bad" never converts: 0, not -0
    assert f'data-served="{rows["bad"]["served"]!r}"' in section
    assert f'data-q="{rows["bad"]["q"]!r}"' in section
    [other] = re.findall(r'<section data-experiment="live_shop".*?</section>', page, re.S)
    assert "Lower loss is better" in other and "data-mean-loss=" in other
