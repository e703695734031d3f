"""``tsi evaluate`` on served logs applies each experiment's window (``feedback_ttl``),
``aggregate`` and ``default_loss`` as the service did.

The oracle is the service itself: its own dataflow (``build_flow``, event time, in
``tsi demo``'s closed loop, as ``bench/bench_conversions.py`` runs it), with every
``Bandit.update`` the service makes recorded: the loss it applied to each served request.
"""

from pathlib import Path

import numpy as np
import orjson
import pytest
from bytewax.testing import run_main
from typer.testing import CliRunner

from flows.cli import app
from flows.service.dataflow import build_flow
from flows.service.instances.instance import aggregate_losses, in_window
from flows.service.instances.registry import Registry
from flows.tools.demo import Loop, loop_wiring
from flows.tools.evaluation import EvaluationError, ips_estimate, snips_estimate
from flows.tools.evaluation.served import join_served
from flows.tools.traffic import START_TS, Demo
from tsi_core.bandit import Bandit

ARMS = ("c2", "c3", "c4", "c5", "c6")
RATES = np.array([0.02, 0.03, 0.04, 0.05, 0.06])
TTL = 600.0
DEFAULT = 0.125  # no mean, sum, last or max of the integer losses below is this


def registry_text(settings: str, seed: int = 0) -> str:
    arms = ", ".join(f'"{a}"' for a in ARMS)
    return f"[experiments.shop]\narms = [{arms}]\nfeedback_ttl = {TTL}\nseed = {seed}\n{settings}"


class Stream(Demo):
    """A request every second; ``answer(rng, arm)`` gives each feedback's (loss, delay)."""

    def __init__(self, n: int, seed: int, answer) -> None:
        super().__init__(events=[], span=float(n), seed=seed)
        self.answer = answer
        for i in range(n):
            rid, ts = f"r{i:06d}", START_TS + float(i)
            message = {"type": "request", "experiment": "shop", "request_id": rid, "ts": ts}
            self.events.append(orjson.dumps(message))
            self.truth[rid] = ("shop", ts, RATES)

    def respond(self, selection: dict) -> list[bytes]:
        rid = selection["request_id"]
        _, ts, _ = self.truth[rid]
        fields = {"type": "feedback", "experiment": "shop", "request_id": rid}
        return [
            orjson.dumps({**fields, "loss": loss, "ts": ts + delay})
            for loss, delay in self.answer(self._rng, selection["arm"])
        ]


def conversions(rng, arm):
    """A conversion (loss 0) after a minute on average, nothing otherwise."""
    return [(0.0, float(rng.exponential(60.0)))] if rng.random() < RATES[arm] else []


def several(rng, arm):
    """0 to 3 feedback of integer losses, up to 1.5 windows late."""
    count = int(rng.integers(0, 4))
    losses = rng.choice([0.0, 1.0, 2.0, 3.0, 5.0], size=count)
    return [(float(loss), float(rng.uniform(0, 1.5 * TTL))) for loss in losses]


def serve(monkeypatch, text: str, n: int, answer, seed: int = 0):
    """(selections, events sent, the loss the service applied to each request_id)."""
    registry = Registry.from_toml(text)
    applied, update = [], Bandit.update

    def recorded(self, ticket, loss):
        applied.append((ticket.round, loss))
        return update(self, ticket, loss)

    monkeypatch.setattr(Bandit, "update", recorded)
    loop = Loop(Stream(n, seed, answer), None, {"shop": TTL})
    wiring = loop_wiring(loop)
    run_main(build_flow(registry, wiring, clock=lambda: loop.now, flow_id="w", event_time=True))
    monkeypatch.undo()
    rid_of = {s["round"]: s["request_id"] for s in loop.selections}
    assert len(rid_of) == len(loop.selections) == n
    losses = {}
    for round_, loss in applied:
        assert rid_of[round_] not in losses  # one update per request
        losses[rid_of[round_]] = loss
    return loop.selections, loop.sent, losses


def joined(selections, sent, text: str | None):
    lines = [orjson.dumps(s) for s in selections]
    registry = None if text is None else Registry.from_toml(text)
    served = join_served(lines, sent, None, "test", registry)
    rid = [s["request_id"] for s in selections]
    return served, {rid[r.line - 1]: r.loss for r in served.log.records}


def open_at_end(sent) -> set[str]:
    """The requests whose window had not ended at the newest event time sent."""
    events = [orjson.loads(raw) for raw in sent]
    end = max(e["ts"] for e in events)
    return {e["request_id"] for e in events if e["type"] == "request" and e["ts"] + TTL > end}


@pytest.mark.parametrize("aggregate", ["first", "sum", "mean", "last", "max"])
@pytest.mark.parametrize("default", [None, DEFAULT])
def test_each_aggregate_and_default_joins_the_losses_the_service_applied(
    monkeypatch, aggregate, default
):
    n = 1500
    text = registry_text(
        f'aggregate = "{aggregate}"\n' + ("" if default is None else f"default_loss = {default}\n")
    )
    selections, sent, applied = serve(monkeypatch, text, n, several)
    served, got = joined(selections, sent, text)
    assert got and all(got[rid] == applied[rid] for rid in got)  # bit for bit
    # what the join leaves out that the service applied: windows open at the log's end
    assert set(applied) - set(got) <= open_at_end(sent)
    assert served.open_windows <= len(open_at_end(sent))
    assert served.late_feedback > 0 and served.untimed == 0
    assert served.defaulted == sum(loss == DEFAULT for loss in got.values())
    assert (served.defaulted > 0) == (default is not None)
    assert (served.combined > 0) == (aggregate != "first")
    missing = n - len(got) - served.open_windows
    assert served.unmatched_selections == missing and (missing > 0) == (default is None)
    _, old = joined(selections, sent, None)  # the join without the served registry's rules
    assert old != got  # late feedback kept, or only the first, or no default


@pytest.fixture(scope="module")
def conversion_run():
    """A conversion experiment served 20,000 requests: feedback only for conversions,
    ``default_loss = 1``, a 5% floor on every arm."""
    text = registry_text("default_loss = 1.0\nmin_share = 0.05\n", seed=3)
    with pytest.MonkeyPatch.context() as monkeypatch:
        return text, *serve(monkeypatch, text, 20_000, conversions, seed=3)


def test_a_conversion_log_gets_the_losses_the_service_applied(conversion_run):
    text, selections, sent, applied = conversion_run
    served, got = joined(selections, sent, text)
    assert all(got[rid] == applied[rid] for rid in got)
    assert set(applied) - set(got) <= open_at_end(sent)
    assert 0 < served.open_windows == len(open_at_end(sent))  # a default closes each
    assert served.defaulted > 0.9 * len(got) and served.unmatched_selections == 0
    _, old = joined(selections, sent, None)
    assert set(old.values()) == {0.0}  # the old join saw the conversions alone


def estimates(selections, got, q):
    """IPS and SNIPS of the policy with arm probabilities ``q`` on the joined rows."""
    rows = [s for s in selections if s["request_id"] in got]
    w = np.array([q[s["arm"]] / s["prob"] for s in rows])
    losses = np.array([got[s["request_id"]] for s in rows])
    return ips_estimate(w, losses, 0.999), snips_estimate(w, losses, 0.999)


@pytest.mark.parametrize("target", ["uniform", "c2", "c6"])
def test_ips_and_snips_recover_a_known_policy_value_where_the_old_join_was_biased(
    conversion_run, target
):
    text, selections, sent, _ = conversion_run
    m = len(ARMS)
    q = np.full(m, 1 / m) if target == "uniform" else np.eye(m)[ARMS.index(target)]
    value = float(q @ (1 - RATES))  # a conversion's feedback is late with chance e^-10
    _, got = joined(selections, sent, text)
    _, old = joined(selections, sent, None)
    for estimate in estimates(selections, got, q):
        assert estimate.contains(value), (target, estimate, value)
    for estimate in estimates(selections, old, q):
        assert not estimate.contains(value), (target, estimate, value)


def write(directory: Path, selections, sent, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "selections.jsonl").write_bytes(b"\n".join(orjson.dumps(s) for s in selections))
    (directory / "events.jsonl").write_bytes(b"\n".join(sent))
    (directory / "registry.toml").write_text(text)
    return directory


def logged_value(out: Path) -> float:
    figures = orjson.loads((out / "evaluation.json").read_bytes())
    [config] = figures["configurations"].values()
    return config["experiments"]["shop"]["logged"]["value"]


def test_the_command_on_files_joins_by_the_served_registry(conversion_run, tmp_path):
    text, selections, sent, _ = conversion_run
    served, got = joined(selections, sent, text)
    want = float(np.mean(list(got.values())))
    directory = write(tmp_path / "served", selections, sent, text)
    plain = tmp_path / "plain.toml"  # a configuration to compare, without default_loss
    plain.write_text(registry_text("min_share = 0.05\n", seed=3))
    files = ["--selections", str(directory / "selections.jsonl")]
    files += ["--events", str(directory / "events.jsonl")]
    runs = {
        "directory": [str(directory)],
        "files, served registry first": [*files, "--registry", str(directory / "registry.toml")],
        "files, --served-registry": [
            *files,
            "--registry",
            str(plain),
            "--served-registry",
            str(directory / "registry.toml"),
        ],
        "directory, another configuration": [str(directory), "--registry", str(plain)],
    }
    for label, args in runs.items():
        out = tmp_path / label.replace(" ", "_").replace(",", "")
        result = CliRunner().invoke(app, ["evaluate", *args, "--out", str(out)])
        assert result.exit_code == 0, (label, result.output)
        assert logged_value(out) == pytest.approx(want, rel=1e-12), label
        defaulted = f"{served.defaulted:,} the default_loss of a window without feedback"
        assert defaulted in result.output
    # the first --registry serves when no other is named: without default_loss, biased
    out = tmp_path / "plain"
    args = ["evaluate", *files, "--registry", str(plain), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert logged_value(out) == 0.0 < want


def line(**fields) -> bytes:
    return orjson.dumps(fields)


SEL = [
    line(experiment="e", unit=None, request_id=r, arm=1, arm_name="b", prob=0.5)
    for r in ("r1", "r2", "r3")
]
T = START_TS  # times near the wall clock, as the parsers require
RULES = Registry.from_toml(
    '[experiments.e]\narms = ["a", "b"]\nfeedback_ttl = 10\naggregate = "sum"\ndefault_loss = 4.0'
)


def test_without_times_every_feedback_counts_and_the_window_is_not_checked():
    events = [
        line(type="request", experiment="e", request_id=r, ts=None if r == "r1" else T + 100.0)
        for r in ("r1", "r2", "r3")
    ]
    events += [
        line(type="feedback", experiment="e", request_id="r1", loss=1.0),
        line(type="feedback", experiment="e", request_id="r1", loss=2.0, ts=T + 500.0),
        line(type="feedback", experiment="e", request_id="r2", loss=1.0, ts=T + 105.0),
        line(type="feedback", experiment="e", request_id="r2", loss=2.0),  # no ts: counted
        line(type="feedback", experiment="e", request_id="r2", loss=8.0, ts=T + 110.0),  # late
    ]
    served = join_served(SEL, events, None, "t", RULES)
    assert [r.loss for r in served.log.records] == [3.0, 3.0, 4.0]  # r3: the default
    assert (served.untimed, served.late_feedback, served.combined) == (2, 1, 2)
    assert (served.defaulted, served.open_windows) == (1, 0)
    assert "2 could not have their window checked (no time)" in served.summary()


def test_kafka_timestamps_time_events_without_ts():
    events = [(line(type="request", experiment="e", request_id=r), T + 100.0) for r in ("r1", "r2")]
    events += [
        (line(type="feedback", experiment="e", request_id="r1", loss=1.0), T + 109.0),
        (line(type="feedback", experiment="e", request_id="r1", loss=2.0), T + 110.0),  # late
        (line(type="feedback", experiment="e", request_id="r2", loss=9.0, ts=T + 104.0), T + 200.0),
    ]
    served = join_served(SEL[:2], events, None, "t", RULES)  # the event's ts comes first
    assert [r.loss for r in served.log.records] == [1.0, 9.0]
    assert (served.late_feedback, served.untimed) == (1, 0)


def test_a_window_open_at_the_end_of_the_log_is_not_evaluated():
    events = [line(type="request", experiment="e", request_id="r1", ts=T + 0.0)]
    events += [line(type="request", experiment="e", request_id="r2", ts=T + 5.0)]
    events += [line(type="feedback", experiment="e", request_id="r2", loss=1.0, ts=T + 12.0)]
    served = join_served(SEL[:2], events, None, "t", RULES)
    assert [r.loss for r in served.log.records] == [
        4.0
    ]  # r1 closed at 10 with the default; r2 open until 15
    assert (served.open_windows, served.unmatched_selections) == (1, 0)


def test_an_experiment_missing_from_the_served_registry_is_named():
    other = Registry.from_toml('[experiments.x]\narms = ["a", "b"]')
    with pytest.raises(EvaluationError, match=r"\['e'\] of the selections not in the served"):
        join_served(SEL, [], None, "t", other)


def test_the_rules_are_the_services_own():
    combined = [aggregate_losses(a, [2.0, 5.0, 1.0]) for a in ("first", "sum", "last", "max")]
    assert combined == [2.0, 8.0, 1.0, 5.0]
    assert aggregate_losses("mean", [2.0, 5.0, 1.0]) == pytest.approx(8 / 3)
    with pytest.raises(ValueError, match=r"aggregate must be one of .*'median'"):
        aggregate_losses("median", [1.0])
    assert in_window(0.0, 9.999, 10.0) and not in_window(0.0, 10.0, 10.0)
    assert in_window(20.0, 10.5, 10.0) and not in_window(20.0, 10.0, 10.0)  # came first
