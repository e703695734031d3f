"""Counterfactual evaluation (flows.tools.evaluation): exact full-information replays, replay and
rejection sampling on bandit logs, IPS, and the refusal of every malformed line."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from arena.lab.environments import bernoulli, contextual, piecewise_stationary
from flows.service.instances.instance import uniform_draw
from flows.service.instances.registry import Registry
from flows.tools.evaluation import (
    BANDIT,
    FULL_INFORMATION,
    EvaluationError,
    effective_sample_size,
    evaluate,
    ips_estimate,
    load_log,
    mean_estimate,
    read_log,
    snips_estimate,
)
from flows.tools.loss_table import LossTable
from tsi_core import Bandit, BatchBandit

REGISTRY = Registry.from_toml(
    """
[experiments.home]
arms = ["a", "b", "c"]
seed = 5

[experiments.four]
arms = ["w", "x", "y", "z"]
seed = 11

[experiments.users]
arms = ["a", "b", "c"]
per_unit = true
seed = 3

[experiments.shifts]
arms = ["a", "b", "c", "d"]
competition = { kind = "switching", rate = 0.005, switches = 2 }

[experiments.ctx]
arms = ["a", "b", "c", "d"]
competition = { kind = "contextual", n_contexts = 3 }
seed = 9
"""
)


def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def full_rows(env, experiment, unit=None):
    rows = []
    for t, losses in enumerate(env.losses):
        row = {"experiment": experiment, "losses": losses.tolist()}
        if unit is not None:
            row["unit"] = unit
        if env.contexts is not None:
            row["context"] = int(env.contexts[t])
        rows.append(row)
    return rows


def replay_by_hand(experiment, key, losses, lines, contexts=None):
    """Σ q·l and the loss of the draws of one instance, with the documented hashed draws."""
    exp = REGISTRY[experiment]
    bandit = Bandit(len(exp.arms), exp.competition, exp.gamma, instance_id=key)
    expected = realised = 0.0
    for t, (row, line) in enumerate(zip(losses, lines, strict=True)):
        context = None if contexts is None else int(contexts[t])
        expected += float(bandit.probabilities(context) @ row)
        ticket = bandit.select(context, uniform_draw(exp.seed, key, str(line)))
        realised += row[ticket.arm]
        bandit.update(ticket, float(row[ticket.arm]))
    return expected, realised


# --------------------------------------------------------------------------- full information


def test_full_information_regret_equals_an_independent_replay(tmp_path):
    env = bernoulli(400, n_arms=4, seed=2)
    log = load_log(write(tmp_path / "full.jsonl", full_rows(env, "four")))
    assert log.kind == FULL_INFORMATION and len(log) == 400
    result = evaluate(log, REGISTRY)["four"]
    expected, realised = replay_by_hand("four", "four", env.losses, range(1, 401))
    assert result.rounds == 400 and result.switches == 3  # Fixed: the default 3 switches
    assert result.expected_loss == pytest.approx(expected, rel=1e-12)
    assert result.realised_loss == pytest.approx(realised, rel=1e-12)
    assert result.best_fixed_loss == pytest.approx(env.best_fixed_loss(), rel=1e-12)
    assert result.best_arm == REGISTRY["four"].arms[int(np.argmin(env.losses.sum(axis=0)))]
    assert result.best_switching_loss == pytest.approx(env.best_switching_loss(3), rel=1e-12)
    assert result.regret_fixed == pytest.approx(expected - env.best_fixed_loss(), rel=1e-9)
    assert result.regret_switching == pytest.approx(expected - env.best_switching_loss(3), rel=1e-9)
    assert result.normalised_fixed == pytest.approx(
        result.regret_fixed / (env.range * math.sqrt(4 * 400))
    )
    # the curves add up to the totals
    assert result.curve_expected_loss.shape == (400,)
    assert result.curve_expected_loss.sum() == pytest.approx(expected, rel=1e-9)
    assert np.cumsum(result.curve_regret_fixed)[-1] == pytest.approx(result.regret_fixed, rel=1e-9)
    # another evaluation seed gives other draws
    other = evaluate(log, REGISTRY, seed=1)["four"]
    assert other.expected_loss != result.expected_loss
    assert other.best_fixed_loss == result.best_fixed_loss
    assert "| regret vs best fixed arm |" in result.to_markdown()


def test_switching_competitor_uses_the_competition_switches_or_the_argument(tmp_path):
    env = piecewise_stationary(300, n_arms=4, n_switches=2, seed=4)
    log = load_log(write(tmp_path / "sw.jsonl", full_rows(env, "shifts")))
    result = evaluate(log, REGISTRY)["shifts"]
    expected, _ = replay_by_hand("shifts", "shifts", env.losses, range(1, 301))
    assert result.switches == 2
    assert result.best_switching_loss == pytest.approx(env.best_switching_loss(2), rel=1e-12)
    assert result.best_switching_loss < result.best_fixed_loss  # the change points matter
    assert result.regret_switching == pytest.approx(expected - env.best_switching_loss(2))
    five = evaluate(log, REGISTRY, switches=5)["shifts"]
    assert five.switches == 5
    assert five.best_switching_loss == pytest.approx(env.best_switching_loss(5), rel=1e-12)


def test_per_unit_splitting_each_unit_against_its_own_competitors(tmp_path):
    rng = np.random.default_rng(0)
    means = {"u1": [0.2, 0.6, 0.8], "u2": [0.8, 0.6, 0.2]}  # different best arms
    units = rng.choice(["u1", "u2"], size=500)
    rows, tables, lines = [], {"u1": [], "u2": []}, {"u1": [], "u2": []}
    for line, unit in enumerate(units, start=1):
        losses = (rng.random(3) < means[unit]).astype(float)
        rows.append({"experiment": "users", "unit": str(unit), "losses": losses.tolist()})
        tables[unit].append(losses)
        lines[unit].append(line)
    result = evaluate(load_log(write(tmp_path / "units.jsonl", rows)), REGISTRY)["users"]
    exp = REGISTRY["users"]
    expected = best = switching = 0.0
    for unit in ("u1", "u2"):
        env = LossTable(unit, np.array(tables[unit]))
        key = exp.instance_key(unit)
        expected += replay_by_hand("users", key, env.losses, lines[unit])[0]
        best += env.best_fixed_loss()
        switching += env.best_switching_loss(3)
    pooled = LossTable("pooled", np.array([r["losses"] for r in rows])).best_fixed_loss()
    assert best < pooled - 50  # the split changes the competitor a lot
    assert len(result.instances) == 2 and result.rounds == 500
    assert {i.unit for i in result.instances} == {"u1", "u2"}
    assert {i.best_arm for i in result.instances} == {"a", "c"} and result.best_arm is None
    assert result.expected_loss == pytest.approx(expected, rel=1e-12)
    assert result.best_fixed_loss == pytest.approx(best, rel=1e-12)
    assert result.best_switching_loss == pytest.approx(switching, rel=1e-12)
    assert result.regret_fixed == pytest.approx(expected - best, rel=1e-9)
    assert sum(i.rounds for i in result.instances) == 500
    assert "most often" in result.to_markdown()


def test_contextual_experiment_reports_the_best_map_context_to_arm(tmp_path):
    env = contextual(300, n_arms=4, n_contexts=3, seed=1)
    result = evaluate(load_log(write(tmp_path / "c.jsonl", full_rows(env, "ctx"))), REGISTRY)
    result = result["ctx"]
    expected, _ = replay_by_hand("ctx", "ctx", env.losses, range(1, 301), env.contexts)
    assert result.expected_loss == pytest.approx(expected, rel=1e-12)
    assert result.best_contextual_loss == pytest.approx(env.best_contextual_loss(), rel=1e-12)
    assert result.regret_contextual == pytest.approx(expected - env.best_contextual_loss())


@pytest.mark.parametrize(("variant", "rel"), [("paper", 1e-12), ("robust", 1e-6)])
def test_full_information_regret_is_exact_under_a_large_offset(variant, rel):
    """Decisions are invariant to 2^k·l + 2^j; the regret scales by 2^k and keeps its digits:
    all of them with the paper's running minimum (an integer shift is exact), to the
    rounding of a mean kept 2^30 times above the losses' spread with the default."""
    registry = Registry.from_toml(
        f'[experiments.home]\narms = ["a", "b", "c"]\nseed = 5\nvariant = "{variant}"'
    )
    env = bernoulli(300, n_arms=3, seed=8)
    big = env.affine(2.0**10, 2.0**40)
    small = evaluate(read_log(json.dumps(r) for r in full_rows(env, "home")), registry)["home"]
    large = evaluate(read_log(json.dumps(r) for r in full_rows(big, "home")), registry)["home"]
    assert small.regret_fixed != 0
    assert large.regret_fixed == pytest.approx(2.0**10 * small.regret_fixed, rel=rel)
    assert large.normalised_fixed == pytest.approx(small.normalised_fixed, rel=rel)


# --------------------------------------------------------------------------- bandit logs

MEANS = np.array([0.2, 0.5, 0.8])  # the environment of the experiment "home"


def bandit_rows(n_rounds, probs, seed):
    """A log of a fixed logging policy ``probs`` on Bernoulli arms of means MEANS."""
    rng = np.random.default_rng(seed)
    arms = rng.choice(3, size=n_rounds, p=probs)
    losses = (rng.random(n_rounds) < MEANS[arms]).astype(float)
    return [
        {"experiment": "home", "arm": int(a), "prob": float(probs[a]), "loss": float(x)}
        for a, x in zip(arms, losses, strict=True)
    ]


def online_loss(n_rounds, runs=48, seed=0):
    """The configuration's true mean per-round loss over its first n rounds, run online on
    fresh draws (expected loss q·μ per round, averaged over independent runs)."""
    exp = REGISTRY["home"]
    rng = np.random.default_rng([seed, 1])  # not the bandits' own stream
    bandits = BatchBandit(runs, 3, exp.competition, exp.gamma, seed=seed)
    total = 0.0
    for _ in range(n_rounds):
        total += float((bandits.probabilities() @ MEANS).mean())
        tickets = bandits.select()
        bandits.update(tickets, (rng.random(runs) < MEANS[tickets.arms]).astype(float))
    return total / n_rounds


def test_replay_on_a_uniform_log_covers_the_policy_online_loss(tmp_path):
    n_rounds = 6000
    log = load_log(write(tmp_path / "u.jsonl", bandit_rows(n_rounds, np.full(3, 1 / 3), 1)))
    assert log.kind == BANDIT
    result = evaluate(log, REGISTRY, level=0.99)["home"]
    assert result.uniform and result.method.startswith("replay")
    assert result.expected_accepted == pytest.approx(n_rounds / 3)
    assert abs(result.policy.n - n_rounds / 3) < 4 * result.accepted_sd
    truth = online_loss(result.policy.n)
    assert result.policy.contains(truth), (result.policy, truth)
    # each estimate also covers the value along the policy's own path in this replay
    path = result.probabilities @ MEANS
    assert result.policy.contains(path[result.accepted_rows].mean())
    assert result.ips.contains(path.mean())
    # the logging policy is much worse, and the replay tells them apart
    assert result.logged.contains(MEANS.mean())
    assert result.policy.high < result.logged.low
    assert len(result.accepted_losses) == result.policy.n == len(result.accepted_rows)
    assert result.weights.shape == (n_rounds,)
    text = result.to_markdown()
    assert "replay (Li et al. 2011)" in text and "99% CI" in text


def test_rejection_sampling_on_a_non_uniform_log_covers_the_policy_online_loss(tmp_path):
    probs = np.array([0.1, 0.2, 0.7])  # the logger favours the worst arm
    n_rounds = 15_000
    log = load_log(write(tmp_path / "nu.jsonl", bandit_rows(n_rounds, probs, 2)))
    result = evaluate(log, REGISTRY, level=0.99)["home"]
    assert not result.uniform and result.method.startswith("rejection")
    assert result.min_prob == pytest.approx(0.1)
    assert abs(result.policy.n - 0.1 * n_rounds) < 4 * result.accepted_sd
    assert result.max_weight <= result.weight_bound + 1e-12
    assert 0 < result.effective_sample_size < n_rounds
    truth = online_loss(result.policy.n, seed=1)
    assert result.policy.contains(truth), (result.policy, truth)
    # IPS and SNIPS estimate the mean value of the policy's snapshots along its path here
    path = result.probabilities @ MEANS
    assert result.policy.contains(path[result.accepted_rows].mean())
    assert result.ips.contains(path.mean()) and result.snips.contains(path.mean())
    assert result.probabilities.shape == (n_rounds, 3)
    assert result.logged.contains(float(probs @ MEANS))
    assert result.policy.high < result.logged.low


def test_policy_and_snips_estimates_are_affine_equivariant():
    rows = bandit_rows(3000, np.array([0.2, 0.3, 0.5]), 3)
    moved = [{**row, "loss": 2.0**10 * row["loss"] + 2.0**40} for row in rows]
    a = evaluate(read_log(json.dumps(r) for r in rows), REGISTRY)["home"]
    b = evaluate(read_log(json.dumps(r) for r in moved), REGISTRY)["home"]
    assert np.array_equal(a.accepted_rows, b.accepted_rows)  # the same decisions
    for name in ("policy", "snips", "logged"):
        x, y = getattr(a, name), getattr(b, name)
        assert y.value == pytest.approx(2.0**10 * x.value + 2.0**40, rel=1e-12)
        assert y.stderr == pytest.approx(2.0**10 * x.stderr, rel=1e-6)
    # plain IPS is not: the offset enters through mean(w) and its variance explodes
    assert b.ips.stderr > 1e3 * 2.0**10 * a.ips.stderr


def test_ips_of_a_fixed_policy_is_unbiased_with_honest_intervals():
    logging = np.array([0.6, 0.3, 0.1])
    target = np.array([0.1, 0.2, 0.7])
    true_value = float(target @ MEANS)
    rng = np.random.default_rng(7)
    values, covered, covered_sn = [], 0, 0
    for _ in range(200):
        arms = rng.choice(3, size=1000, p=logging)
        losses = (rng.random(1000) < MEANS[arms]).astype(float)
        weights = target[arms] / logging[arms]
        ips = ips_estimate(weights, losses)
        values.append(ips.value)
        covered += ips.contains(true_value)
        covered_sn += snips_estimate(weights, losses).contains(true_value)
    values = np.array(values)
    assert abs(values.mean() - true_value) < 4 * values.std(ddof=1) / math.sqrt(200)
    assert covered >= 170 and covered_sn >= 170  # ≥ 85% of nominal 95%
    # the logging policy's own value is far: the estimator is not just echoing the log
    assert abs(values.mean() - float(logging @ MEANS)) > 10 * values.std(ddof=1) / math.sqrt(200)


def test_effective_sample_size():
    assert effective_sample_size(np.ones(50)) == pytest.approx(50)
    assert effective_sample_size([1.0, 0.0, 0.0, 0.0]) == pytest.approx(1)
    assert effective_sample_size([0.0, 0.0]) == 0.0
    # Kish: (1 + 2 + 3)² / (1 + 4 + 9), whatever the weights' scale
    assert effective_sample_size([1.0, 2.0, 3.0]) == pytest.approx(36 / 14, rel=1e-15)
    assert effective_sample_size([10.0, 20.0, 30.0]) == pytest.approx(36 / 14, rel=1e-15)


def test_every_estimate_carries_the_ess_of_its_own_weights(tmp_path):
    weights, losses = [1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 1.0, 9.0]
    assert ips_estimate(weights, losses).ess == pytest.approx(36 / 14, rel=1e-15)
    assert snips_estimate(weights, losses).ess == pytest.approx(36 / 14, rel=1e-15)
    assert mean_estimate(losses).ess == 4.0  # every term weighs 1
    log = load_log(write(tmp_path / "nu.jsonl", bandit_rows(600, np.array([0.2, 0.3, 0.5]), 2)))
    result = evaluate(log, REGISTRY, min_ess=50)["home"]
    w = result.weights
    assert result.ips.ess == pytest.approx(w.sum() ** 2 / (w**2).sum(), rel=1e-12)
    assert result.snips.ess == result.ips.ess < 600
    assert result.policy.ess == result.policy.n == len(result.accepted_rows)
    assert result.logged.ess == 600 and result.min_ess == 50
    with pytest.raises(EvaluationError, match=r"\(--min-ess\) must be a number >= 0, got -1"):
        evaluate(log, REGISTRY, min_ess=-1)


def test_several_experiments_and_the_experiment_filter():
    rows = bandit_rows(300, np.full(3, 1 / 3), 4)
    rows += full_rows(bernoulli(10, 4, 0), "four")  # another kind: refused below
    with pytest.raises(EvaluationError, match=r"<log>:301: a full-information record"):
        read_log(json.dumps(r) for r in rows)
    other = [{**r, "experiment": "users", "unit": f"u{i % 3}"} for i, r in enumerate(rows[:300])]
    log = read_log(json.dumps(r) for r in [*rows[:300], *other])
    both = evaluate(log, REGISTRY)
    assert list(both.results) == ["home", "users"] and both["users"].n_instances == 3
    assert both["home"].rounds == both["users"].rounds == 300
    assert both.to_markdown().count("\n## ") == 2
    assert json.dumps(both.to_dict())  # serialisable
    only = evaluate(log, REGISTRY, experiment="users")
    assert list(only.results) == ["users"]
    with pytest.raises(EvaluationError, match="no record of experiment 'ctx'"):
        evaluate(log, REGISTRY, experiment="ctx")
    with pytest.raises(EvaluationError, match="level must be"):
        evaluate(log, REGISTRY, level=1.5)


# --------------------------------------------------------------------------- malformed input

GOOD_BANDIT = {"experiment": "home", "arm": 0, "prob": 0.5, "loss": 1.0}
GOOD_FULL = {"experiment": "home", "losses": [0.0, 1.0, 0.5]}

PARSE_ERRORS = [
    # (kind of the valid lines, bad line text, fragments of the message)
    (GOOD_BANDIT, "{not json", ["not valid JSON", "'{not json'"]),
    (GOOD_BANDIT, "[1, 2]", ["expected a JSON object", "[1, 2]"]),
    (GOOD_BANDIT, '{"arm": 0, "prob": 0.5, "loss": 1}', ["'experiment' is required"]),
    (GOOD_BANDIT, '{"experiment": 7, "arm": 0, "prob": 0.5, "loss": 1}', ["experiment", "7"]),
    (
        GOOD_BANDIT,
        '{"experiment": "home", "unit": "", "arm": 0, "prob": 0.5, "loss": 1}',
        ["unit must be a string", "''"],
    ),
    (GOOD_BANDIT, '{"experiment": "home", "arm": 0, "prob": 0.5}', ["'loss' is required"]),
    (
        GOOD_BANDIT,
        '{"experiment": "home", "arm": "1", "prob": 0.5, "loss": 1}',
        ["arm must be an integer", "'1'"],
    ),
    (GOOD_BANDIT, '{"experiment": "home", "arm": -1, "prob": 0.5, "loss": 1}', ["arm", "-1"]),
    (GOOD_BANDIT, '{"experiment": "home", "arm": 1.0, "prob": 0.5, "loss": 1}', ["arm", "1.0"]),
    (
        GOOD_BANDIT,
        '{"experiment": "home", "arm": 0, "prob": 0, "loss": 1}',
        ["prob must be in (0, 1]", "got 0"],
    ),
    (GOOD_BANDIT, '{"experiment": "home", "arm": 0, "prob": 1.5, "loss": 1}', ["prob", "1.5"]),
    (GOOD_BANDIT, '{"experiment": "home", "arm": 0, "prob": true, "loss": 1}', ["prob", "True"]),
    (
        GOOD_BANDIT,
        '{"experiment": "home", "arm": 0, "prob": 0.5, "loss": "x"}',
        ["loss must be a finite number", "'x'"],
    ),
    (
        GOOD_BANDIT,
        '{"experiment": "home", "arm": 0, "prob": 0.5, "loss": 1e400}',
        ["not valid JSON", "1e400"],
    ),
    (
        GOOD_BANDIT,
        '{"experiment": "home", "arm": 0, "prob": 0.5, "loss": NaN}',
        ["not valid JSON", "NaN"],
    ),
    (
        GOOD_BANDIT,
        '{"experiment": "home", "arm": 0, "prob": 0.5, "loss": 1e301}',
        ["loss", "1e+301"],
    ),
    (
        GOOD_BANDIT,
        '{"experiment": "home", "context": -1, "arm": 0, "prob": 0.5, "loss": 1}',
        ["context must be an integer >= 0", "-1"],
    ),
    (
        GOOD_BANDIT,
        '{"experiment": "home", "losses": [1, 2, 3]}',
        ["a full-information record", "line 1 is a bandit record"],
    ),
    (GOOD_BANDIT, '{"experiment": "home", "losses": [1, 2, 3], "arm": 0}', ["both 'losses'"]),
    (GOOD_BANDIT, '{"experiment": "home"}', ["neither 'losses'"]),
    (GOOD_FULL, '{"experiment": "home", "losses": []}', ["losses must be a non-empty", "[]"]),
    (GOOD_FULL, '{"experiment": "home", "losses": "1,2,3"}', ["losses", "'1,2,3'"]),
    (GOOD_FULL, '{"experiment": "home", "losses": [0, "a", 1]}', ["losses[1]", "'a'"]),
    (GOOD_FULL, '{"experiment": "home", "losses": [0, null, 1]}', ["losses[1]", "None"]),
    (
        GOOD_FULL,
        '{"experiment": "home", "arm": 0, "prob": 0.5, "loss": 1}',
        ["a bandit record", "line 1 is a full-information record"],
    ),
]


def assert_line_refused(path: Path, line: int, fragments: list[str]) -> None:
    """``load_log(path)`` refuses it in one line naming the file and ``line``, with every
    fragment in it."""
    with pytest.raises(EvaluationError) as caught:
        load_log(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: ") and "\n" not in message
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize(("good", "bad", "fragments"), PARSE_ERRORS)
def test_malformed_lines_name_the_line_and_the_value(tmp_path, good, bad, fragments):
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{json.dumps(good)}\n\n{bad}\n{json.dumps(good)}\n", encoding="utf-8")
    assert_line_refused(path, 3, fragments)


REGISTRY_ERRORS = [
    ({"experiment": "nope", "arm": 0, "prob": 0.5, "loss": 1}, ["'nope' is not in the registry"]),
    ({"experiment": "home", "losses": [0, 1]}, ["2 losses", "'home' has 3 arms"]),
    ({"experiment": "home", "arm": 3, "prob": 0.5, "loss": 1}, ["arm 3 is out of range"]),
    ({"experiment": "ctx", "arm": 0, "prob": 0.5, "loss": 1}, ["needs a context", "got none"]),
    ({"experiment": "ctx", "context": 5, "arm": 0, "prob": 0.5, "loss": 1}, ["context 5"]),
    ({"experiment": "home", "context": 1, "arm": 0, "prob": 0.5, "loss": 1}, ["context 1"]),
    ({"experiment": "users", "arm": 0, "prob": 0.5, "loss": 1}, ["'unit' is required"]),
]


@pytest.mark.parametrize(("bad", "fragments"), REGISTRY_ERRORS)
def test_lines_the_registry_refuses_name_the_line_and_the_value(tmp_path, bad, fragments):
    good = GOOD_FULL if "losses" in bad else GOOD_BANDIT
    path = write(tmp_path / "bad.jsonl", [good, good, bad, good])
    log = load_log(path)  # valid on its own
    with pytest.raises(EvaluationError) as caught:
        evaluate(log, REGISTRY)
    message = str(caught.value)
    assert message.startswith(f"{path}:3: ") and "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_empty_and_missing_logs_are_refused(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(EvaluationError, match="has no records"):
        load_log(empty)
    with pytest.raises(EvaluationError, match="cannot read log"):
        load_log(tmp_path / "absent.jsonl")
    with pytest.raises(EvaluationError, match="has no records"):
        read_log([])
