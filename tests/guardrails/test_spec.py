"""The registry's guardrails: read with defaults, each bad key refused by name."""

from __future__ import annotations

import pytest

from flows.guardrails.spec import Guardrail
from flows.service.instances.registry import Registry, RegistryError

HEAD = '[experiments.e]\narms = ["control", "b"]\nholdout = { arm = "control", share = 0.1 }\n'


def test_guardrails_are_read_with_their_defaults():
    registry = Registry.from_toml(
        HEAD + 'guardrails = [{ metric = "latency_ms", worse = "lower", margin = 2, '
        'alpha = 0.01, min_samples = 50 }, { metric = "error" }]'
    )
    assert registry["e"].guardrails == (
        Guardrail("latency_ms", "lower", 2.0, 0.01, 50),
        Guardrail("error", "higher", 0.0, 0.05, 100),
    )


def test_no_guardrails_is_the_default():
    assert Registry.from_toml(HEAD)["e"].guardrails == ()


@pytest.mark.parametrize(
    "setting, named",
    [
        ('guardrails = [{ metric = "x", alhpa = 0.1 }]', "'alhpa'"),
        ('guardrails = [{ metric = "no spaces" }]', "'no spaces'"),
        ('guardrails = [{ worse = "higher" }]', "metric must be"),
        ('guardrails = [{ metric = "x", worse = "up" }]', "'up'"),
        ('guardrails = [{ metric = "x", margin = -1 }]', "margin must be a number >= 0, got -1"),
        ('guardrails = [{ metric = "x", alpha = 1.5 }]', "alpha must be a number in (0, 1)"),
        ('guardrails = [{ metric = "x", min_samples = 1 }]', "min_samples must be an integer"),
        ('guardrails = [{ metric = "x" }, { metric = "x" }]', "['x'] are named more than once"),
        ("guardrails = []", "non-empty list"),
        ('guardrails = "x"', "non-empty list"),
    ],
)
def test_a_bad_guardrail_is_refused_naming_it(setting, named):
    with pytest.raises(RegistryError, match="experiment 'e'") as caught:
        Registry.from_toml(HEAD + setting)
    assert named in str(caught.value)


def test_guardrails_without_a_holdout_are_refused_saying_why():
    with pytest.raises(RegistryError, match="guardrails need a holdout"):
        Registry.from_toml('[experiments.e]\narms = ["a", "b"]\nguardrails = [{ metric = "x" }]')


def test_a_guardrail_edit_changes_the_definition_not_the_state():
    before = Registry.from_toml(HEAD)["e"]
    after = Registry.from_toml(HEAD + 'guardrails = [{ metric = "x" }]')["e"]
    assert before.definition != after.definition
    assert after.same_state_as(before.arms, before.template)
