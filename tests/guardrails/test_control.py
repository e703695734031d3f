"""The controller on a fake metrics text, with a recording action; the file action."""

from __future__ import annotations

import pytest

from flows.gateway.live_data import parse_metrics
from flows.guardrails.control import BREACHES, Controller
from flows.guardrails.file_action import ForceArmInFile
from flows.service.instances.registry import Registry, RegistryError

REGISTRY = """[experiments.shop]
arms = ["control", "green"]
holdout = { arm = "control", share = 0.1 }
guardrails = [{ metric = "latency_ms", min_samples = 50 }, { metric = "error" }]
"""


def _text(bandit: tuple[float, float, float], holdout: tuple[float, float, float]) -> str:
    lines = ["# TYPE tsi_guardrail_samples counter"]
    for group, (n, total, squares) in (("bandit", bandit), ("holdout", holdout)):
        at = f'experiment="shop",metric="latency_ms",group="{group}"'
        lines += [
            f"tsi_guardrail_samples_total{{{at}}} {n}",
            f"tsi_guardrail_sum{{{at}}} {total}",
            f"tsi_guardrail_squares_sum{{{at}}} {squares}",
        ]
    return "\n".join(lines) + "\n"


class Recording:
    def __init__(self, fail: int = 0) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.fail = fail

    def __call__(self, experiment: str, arm: str, reason: str) -> None:
        if self.fail:
            self.fail -= 1
            raise OSError("disk full")
        self.calls.append((experiment, arm, reason))


def _breaches() -> float:
    return BREACHES.labels("shop", "latency_ms")._value.get()


def test_a_breach_pauses_to_the_holdout_arm_once():
    registry, action = Registry.from_toml(REGISTRY), Recording()
    controller = Controller(lambda: registry, action)
    before = _breaches()
    slow = parse_metrics(_text((900, 900 * 200.0, 900 * 40100.0), (100, 100 * 100, 100 * 10100.0)))
    for _ in range(3):
        checks = controller.observe(slow)
    latency, error = checks["shop"]
    assert (latency.state, error.state) == ("breached", "waiting")
    assert latency.low > 0 and latency.estimate == pytest.approx(100.0)
    assert [(e, a) for e, a, _ in action.calls] == [("shop", "control")]
    assert "'latency_ms'" in action.calls[0][2] and "above the margin 0" in action.calls[0][2]
    assert _breaches() == before + 1


def test_no_difference_is_ok_and_nothing_is_called():
    registry, action = Registry.from_toml(REGISTRY), Recording()
    same = parse_metrics(_text((900, 900 * 100.0, 900 * 10100.0), (100, 100 * 100, 100 * 10100.0)))
    checks = Controller(lambda: registry, action).observe(same)
    assert checks["shop"][0].state == "ok"
    assert checks["shop"][0].low < 0 < checks["shop"][0].high
    assert action.calls == []


def test_a_failed_action_is_tried_again():
    registry, action = Registry.from_toml(REGISTRY), Recording(fail=1)
    controller = Controller(lambda: registry, action)
    slow = parse_metrics(_text((900, 900 * 200.0, 900 * 40100.0), (100, 100 * 100, 100 * 10100.0)))
    controller.observe(slow)
    assert action.calls == []
    controller.observe(slow)
    assert len(action.calls) == 1


def test_an_experiment_already_forced_to_the_holdout_is_not_paused_again():
    registry = Registry.from_toml(REGISTRY + 'force_arm = "control"\n')
    action = Recording()
    slow = parse_metrics(_text((900, 900 * 200.0, 900 * 40100.0), (100, 100 * 100, 100 * 10100.0)))
    assert Controller(lambda: registry, action).observe(slow)["shop"][0].state == "breached"
    assert action.calls == []


def test_the_file_action_rewrites_only_the_experiments_table(tmp_path):
    path = tmp_path / "registry.toml"
    other = '\n[experiments.blog]\narms = ["a", "b"]\n'
    path.write_text("# mine\n" + REGISTRY + other)
    ForceArmInFile(path)("shop", "control", "latency\nbreached")
    text = path.read_text()
    assert text.startswith("# mine\n")
    registry = Registry.load(path)
    assert registry["shop"].force_arm == "control" and registry["blog"].force_arm is None
    assert "# paused by a guardrail: latency breached" in text
    assert list(tmp_path.iterdir()) == [path]


def test_the_file_action_refuses_an_unknown_experiment_and_changes_nothing(tmp_path):
    path = tmp_path / "registry.toml"
    path.write_text(REGISTRY)
    with pytest.raises(ValueError, match=r"\[experiments.nope\]"):
        ForceArmInFile(path)("nope", "control", "x")
    with pytest.raises(RegistryError, match="force_arm 'zzz'"):
        ForceArmInFile(path)("shop", "zzz", "x")
    assert path.read_text() == REGISTRY


def test_the_live_page_shows_each_guardrails_state():
    from flows.gateway.live import Live
    from flows.gateway.live_data import Sample
    from flows.gateway.live_page import render

    registry = Registry.from_toml(REGISTRY)
    live = Live(["http://x/metrics"], 1.0, Controller(lambda: registry, None))
    text = _text((900, 900 * 200.0, 900 * 40100.0), (100, 100 * 100, 100 * 10100.0))
    text += 'tsi_decisions_total{experiment="shop"} 1000\n'
    live.history.add(Sample.of(100.0, [("http://x/metrics", text)]))
    live.controller.observe(live.history.latest.samples)
    [shop] = live.summary()["experiments"]
    assert [(g["metric"], g["state"]) for g in shop["guardrails"]] == [
        ("latency_ms", "breached"),
        ("error", "waiting"),
    ]
    page = render(live.summary())
    assert '<tr data-guardrail="latency_ms" data-state="breached">' in page
