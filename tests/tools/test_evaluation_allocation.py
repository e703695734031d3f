"""``tsi evaluate`` on logs served with an allocation: the evaluated policy's
target probability is its serving distribution (floor, holdout, burn-in, forced arm) over
each row's eligible arms; rows served a forced arm are counted, not evaluated; holdout
traffic is compared with the bandit's; bad ``why`` and ``eligible`` values are refused
naming the line."""

import json
import math

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.service.instances.registry import Registry
from flows.tools.evaluation import EvaluationError, evaluate, load_log, read_log
from flows.tools.evaluation.compare import compare, configurations
from flows.tools.evaluation.served import join_served
from tests.tools.test_evaluation import assert_line_refused
from tsi_core import Allocation, Bandit

ARMS = ["a", "b", "c", "d"]
MEANS = np.array([0.2, 0.5, 0.6, 0.8])  # Bernoulli losses; "a" is the best arm
ALLOWED = np.array([0.15, 0.9, 0.9, 0.9])  # how often each arm is eligible
LOGGING = Allocation(min_share=0.05, holdout_arm=3, holdout_share=0.1)


def registry(extra: str = ""):
    """An experiment "shop" over ARMS with the allocation settings in ``extra``."""
    return Registry.from_toml(f"[experiments.shop]\narms = {json.dumps(ARMS)}\nseed = 4\n{extra}")


def served_log(n: int, seed: int, forced_every: int = 0) -> list[dict]:
    """A log served by a learning bandit with a floor and a holdout on "d", each request
    allowing 2 to 4 arms (named; the best arm rarely, as ``ALLOWED`` says), losses
    Bernoulli(MEANS); every ``forced_every``-th request served "b" by a forced allocation
    (prob 1, nothing learned)."""
    rng = np.random.default_rng(seed)
    bandit = Bandit(len(ARMS), allocation=LOGGING)
    rows = []
    for t in range(n):
        eligible = []
        while len(eligible) < 2:
            eligible = np.flatnonzero(rng.random(len(ARMS)) < ALLOWED).tolist()
        forced = forced_every and t % forced_every == 0
        if forced:
            bandit.allocation = Allocation(force_arm=1)
            eligible = sorted({*eligible, 1})
        ticket = bandit.select(None, float(rng.random()), eligible)
        loss = float(rng.random() < MEANS[ticket.arm])
        bandit.update(ticket, loss)
        bandit.allocation = LOGGING
        row = {"experiment": "shop", "arm": ticket.arm, "prob": ticket.prob, "loss": loss}
        rows.append({**row, "why": ticket.why, "eligible": [ARMS[a] for a in eligible]})
    return rows


def lines(rows: list[dict]) -> list[str]:
    return [json.dumps(row) for row in rows]


def served_value(rows: list[dict], share: float, holdout: int) -> float:
    """The mean expected loss of a fixed policy, uniform over each row's eligible arms
    with a holdout of ``share`` on arm ``holdout`` (when eligible): computed here by hand."""
    total = 0.0
    for row in rows:
        eligible = [ARMS.index(name) for name in row["eligible"]]
        p = np.zeros(len(ARMS))
        s = share if holdout in eligible else 0.0
        p[eligible] = (1 - s) / len(eligible)
        p[holdout] += s
        total += float(p @ MEANS)
    return total / len(rows)


def test_ips_and_snips_recover_a_known_policy_value_with_floors_holdouts_and_eligibility():
    """A fixed target (uniform over the eligible arms through a burn-in that never ends,
    30% held out on "d") evaluated on logs a learning bandit served with a floor, a
    holdout on "d" and varying eligible arms: over 12 seeds, the estimates centre on the
    value computed by hand, their intervals cover it, and they are far from the value the
    same target would have if every arm were eligible."""
    reg = registry('burn_in = 1000000000\nholdout = { arm = "d", share = 0.3 }')
    errors, covered, wrong = {"ips": [], "snips": []}, 0, []
    for seed in range(12):
        rows = served_log(3000, seed)
        assert {r["why"] for r in rows} == {"bandit", "holdout"}
        result = evaluate(read_log(lines(rows)), reg)["shop"]
        truth = served_value(rows, 0.3, 3)
        for name in errors:
            estimate = getattr(result, name)
            errors[name].append(estimate.value - truth)
            covered += estimate.contains(truth)
        everything = [{**r, "eligible": ARMS} for r in rows]
        wrong.append(served_value(everything, 0.3, 3) - truth)
    assert covered >= 20  # of 24 intervals at 95%
    for name, error in errors.items():
        e = np.array(error)
        assert abs(e.mean()) < 4 * e.std(ddof=1) / math.sqrt(len(e)), (name, e)
        # ignoring the eligible arms would be off by far more than the estimates' spread
        assert abs(np.mean(wrong) - e.mean()) > 5 * e.std(ddof=1) / math.sqrt(len(e))


def test_a_learning_policy_is_evaluated_as_it_would_serve():
    """The evaluated registry's floor and holdout, and each row's eligible arms, make the
    target distribution: zero off the eligible arms, at least the floor (scaled by the
    holdout) on each eligible one, the holdout's share on its arm; SNIPS covers the value
    along the policy's path."""
    reg = registry('min_share = 0.05\nholdout = { arm = "a", share = 0.2 }')
    covered = 0
    for seed in range(10):
        rows = served_log(3000, 100 + seed)
        result = evaluate(read_log(lines(rows)), reg)["shop"]
        p = result.probabilities
        np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
        for t, row in enumerate(rows):
            allowed = np.isin(np.arange(len(ARMS)), [ARMS.index(n) for n in row["eligible"]])
            assert (p[t][~allowed] == 0).all()
            assert (p[t][allowed] >= 0.8 * 0.05 - 1e-12).all()
            if allowed[0]:
                assert p[t][0] >= 0.2
        covered += result.snips.contains(float((p @ MEANS).mean()))
    assert covered >= 8


def test_the_eligible_arms_change_the_target_probability():
    """The same log with and without its eligible arms, for a target uniform over the
    allowed arms (a burn-in that never ends): its probability of the logged arm is 1/|E|
    with them, 1/M without, and differs exactly on the rows that restricted the arms."""
    reg = registry("burn_in = 1000000000")
    rows = served_log(500, 7)
    kept = evaluate(read_log(lines(rows)), reg)["shop"]
    dropped = [{k: v for k, v in row.items() if k != "eligible"} for row in rows]
    ignored = evaluate(read_log(lines(dropped)), reg)["shop"]
    restricted = np.array([len(r["eligible"]) < len(ARMS) for r in rows])
    differs = ~np.isclose(kept.weights, ignored.weights, rtol=0, atol=1e-12)
    prob = np.array([r["prob"] for r in rows])
    np.testing.assert_allclose(kept.weights * prob, [1 / len(r["eligible"]) for r in rows])
    np.testing.assert_allclose(ignored.weights * prob, 1 / len(ARMS))
    assert restricted.any() and np.array_equal(differs, restricted)


def test_forced_rows_are_counted_and_left_out():
    """Rows served a forced arm are left out of every estimate (the same figures as the
    log with those lines blank) and counted, in JSON and Markdown."""
    reg = registry("min_share = 0.02")
    rows = served_log(2000, 3, forced_every=5)
    forced = sum(r["why"] == "forced" for r in rows)
    assert forced == 400 and all(r["prob"] == 1.0 for r in rows if r["why"] == "forced")
    result = evaluate(read_log(lines(rows)), reg)["shop"]
    blanked = ["" if r["why"] == "forced" else json.dumps(r) for r in rows]
    alone = evaluate(read_log(blanked), reg)["shop"]
    assert result.forced == forced and result.rounds == 2000 - forced
    for name in ("policy", "ips", "snips", "logged"):
        assert getattr(result, name) == getattr(alone, name)
    assert np.array_equal(result.accepted_rows, alone.accepted_rows)
    figures = result.to_dict()
    assert figures["forced_excluded"] == forced and figures["served_by"]["forced"] == forced
    assert f"The {forced:,} rows served a forced arm are excluded" in result.to_markdown()
    table = compare(read_log(lines(rows)), configurations([("r", reg)]))
    assert "served a forced arm (why = forced) are excluded" in table.to_markdown()
    assert table.to_dict()["configurations"]["r"]["experiments"]["shop"]["forced_excluded"] == 400


def test_a_log_of_forced_rows_alone_is_refused():
    rows = [{"experiment": "shop", "arm": 1, "prob": 1.0, "loss": 0, "why": "forced"}] * 3
    with pytest.raises(EvaluationError, match="every one of its 3 rows was served a forced arm"):
        evaluate(read_log(lines(rows)), registry())


def test_holdout_traffic_is_compared_with_the_bandit_traffic():
    """Mean observed loss of each group, with intervals, and their difference: the
    holdout arm "d" is the worst, so the bandit's traffic loses less."""
    rows = served_log(6000, 11)
    result = evaluate(read_log(lines(rows)), registry())["shop"]
    comparison = result.holdout
    held = [r["loss"] for r in rows if r["why"] == "holdout"]
    served = [r["loss"] for r in rows if r["why"] == "bandit"]
    assert comparison.arm == "d" and comparison.holdout.n == len(held)
    assert comparison.holdout.value == pytest.approx(np.mean(held))
    assert comparison.bandit.value == pytest.approx(np.mean(served))
    assert comparison.holdout.contains(0.8)
    assert comparison.difference.high < 0
    allowed = sum("d" in r["eligible"] for r in rows)  # a holdout needs its arm eligible
    assert abs(len(held) / allowed - 0.1) < 4 * math.sqrt(0.09 / allowed)
    figures = result.to_dict()["holdout"]
    assert figures["arm"] == "d" and figures["difference"]["value"] < 0
    text = result.to_markdown()
    assert "holdout (arm 'd')" in text and "bandit − holdout" in text and "95% CI" in text
    plain = [{**r, "why": "bandit"} for r in rows]
    assert evaluate(read_log(lines(plain)), registry())["shop"].holdout is None


GOOD = {"experiment": "shop", "arm": 1, "prob": 0.5, "loss": 1, "eligible": ["b", "c"]}

LINE_ERRORS = [
    ({**GOOD, "why": "nope"}, ["why must be one of bandit, holdout, burn_in, forced", "'nope'"]),
    ({**GOOD, "why": 2}, ["why must be one of", "2"]),
    ({**GOOD, "eligible": []}, ["eligible must be a non-empty list", "[]"]),
    ({**GOOD, "eligible": "b"}, ["eligible must be", "'b'"]),
    ({**GOOD, "eligible": ["b", "b"]}, ["distinct", "['b', 'b']"]),
    ({**GOOD, "eligible": [1, True]}, ["eligible must be", "True"]),
    ({**GOOD, "why": "forced"}, ["forced arm is served with prob 1", "0.5"]),
]

EVALUATION_ERRORS = [
    ({**GOOD, "eligible": ["b", "zz"]}, ["eligible arm 'zz' is not one of", "'shop'"]),
    ({**GOOD, "eligible": [1, 9]}, ["eligible arm 9"]),
    ({**GOOD, "eligible": ["a", "c"]}, ["arm 1 was served, but it is not eligible", "'a', 'c'"]),
    ({**GOOD, "eligible": ["b", 1]}, ["eligible arms repeat", "'b', 1"]),
    ({**GOOD, "eligible": ["b"]}, ["only eligible arm is served with prob 1", "0.5"]),
]


@pytest.mark.parametrize(("bad", "fragments"), LINE_ERRORS)
def test_bad_why_and_eligible_values_are_refused_naming_the_line(tmp_path, bad, fragments):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines([GOOD, GOOD, bad, GOOD])) + "\n", encoding="utf-8")
    assert_line_refused(path, 3, fragments)


@pytest.mark.parametrize(("bad", "fragments"), EVALUATION_ERRORS)
def test_eligible_arms_the_experiment_refuses_name_the_line(tmp_path, bad, fragments):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines([GOOD, GOOD, bad, GOOD])) + "\n", encoding="utf-8")
    log = load_log(path)  # valid on its own
    with pytest.raises(EvaluationError) as caught:
        evaluate(log, registry())
    message = str(caught.value)
    assert message.startswith(f"{path}:3: ") and "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_an_evaluated_forced_arm_that_a_request_does_not_allow_is_refused():
    reg = registry('force_arm = "d"')
    with pytest.raises(EvaluationError, match=r"^<log>:2: .*forces arm 'd'.*\['b', 'c'\]"):
        evaluate(read_log(["", json.dumps(GOOD)]), reg)


def test_the_join_carries_why_from_selections_and_eligible_from_requests():
    selections = [
        b'{"experiment":"shop","unit":null,"request_id":"r1","arm":3,"prob":0.4,"why":"holdout"}',
        b'{"experiment":"shop","unit":null,"request_id":"r2","arm":1,"prob":0.5}',
        b'{"experiment":"shop","unit":null,"request_id":"r3","arm":1,"prob":0.5}',
    ]
    events = [
        b'{"type":"request","experiment":"shop","request_id":"r1","eligible":["a","d"]}',
        b'{"type":"request","experiment":"shop","request_id":"r2","context":{"device":"ios"}}',
        b'{"type":"request","experiment":"shop","request_id":"r3","eligible":"b"}',
        b'{"type":"feedback","experiment":"shop","request_id":"r1","loss":1}',
        b'{"type":"feedback","experiment":"shop","request_id":"r2","loss":0}',
        b'{"type":"feedback","experiment":"shop","request_id":"r3","loss":0}',
    ]
    served = join_served(selections, events)
    got = [(r.why, r.eligible) for r in served.log.records]
    assert got == [("holdout", ("a", "d")), ("bandit", None), ("bandit", None)]
    assert served.log.records[1].context == {"device": "ios"}
    assert served.refused == 1  # the request whose eligible arms are no list
    bad = [selections[0].replace(b'"holdout"', b'"later"')]
    with pytest.raises(EvaluationError, match=r"^<served>:1: why must be one of .*'later'"):
        join_served(bad, events)


def test_the_command_evaluates_a_registry_with_allocation_settings(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(lines(served_log(1500, 5, forced_every=10))) + "\n")
    settings = 'min_share = 0.05\nholdout = { arm = "d", share = 0.1 }\n'
    reg = tmp_path / "registry.toml"
    reg.write_text(f"[experiments.shop]\narms = {json.dumps(ARMS)}\nseed = 4\n{settings}")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["evaluate", str(path), "--registry", str(reg), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "bandit − holdout" in result.output and "forced arm" in result.output
    figures = orjson.loads((out / "evaluation.json").read_bytes())
    shop = figures["configurations"][str(reg)]["experiments"]["shop"]
    assert shop["forced_excluded"] == 150 and shop["rounds"] == 1350
    reg.write_text(f"[experiments.shop]\narms = {json.dumps(ARMS)}\nmin_share = 0.5\n")
    refused = CliRunner().invoke(app, ["evaluate", str(path), "--registry", str(reg)])
    assert refused.exit_code != 0 and "min_share" in refused.output and "0.5" in refused.output


def test_named_contexts_are_the_experiments_indices():
    """A log's named contexts give the evaluation of the same log with the indices the
    service serves them under (a value not listed: its attribute's ``other`` slot); a
    missing attribute is refused naming the line."""
    reg = Registry.from_toml(
        '[experiments.shop]\narms = ["a", "b"]\ncontexts = { device = ["ios", "web"] }'
    )
    rng = np.random.default_rng(2)
    devices = rng.choice(["ios", "web", "tv"], size=600).tolist()
    named, indexed = [], []
    for device in devices:
        arm = int(rng.integers(2))
        row = {"experiment": "shop", "arm": arm, "prob": 0.5, "loss": float(arm == 1)}
        named.append({**row, "context": {"device": device}})
        indexed.append({**row, "context": ["ios", "web", "tv"].index(device)})
    a = evaluate(read_log(lines(named)), reg)["shop"]
    b = evaluate(read_log(lines(indexed)), reg)["shop"]
    assert a.snips == b.snips and np.array_equal(a.probabilities, b.probabilities)
    missing = [*named[:2], {**named[2], "context": {"plan": "pro"}}]
    with pytest.raises(EvaluationError, match=r"^<log>:3: unknown context attribute"):
        evaluate(read_log(lines(missing)), reg)
    with pytest.raises(EvaluationError, match=r"^<log>:1: named context .* has no contexts"):
        evaluate(read_log(lines(named[:1])), registry())
