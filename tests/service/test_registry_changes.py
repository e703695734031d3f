"""An experiment's definition changes under learned state: on restore and on a live reload.

Arms are matched by name; a new arm enters with the mean log-weight (or ``new_arm_share``);
a retired arm's open tickets become ``arm_retired`` dead letters; a changed competition
keeps the arm distribution; a removed experiment's instances are archived, not dropped.
"""

import pickle

import numpy as np
import orjson
import pytest

from flows.service.instances.registry import LiveRegistry, Registry, RegistryError
from flows.service.instances.resting import state_of
from flows.service.shards.logic import FlowContext, logic_builder
from flows.service.wire.events import DeadLetter, Origin, Selection, parse_feedback, parse_request
from flows.tools.inspect import describe, render

T0 = 1_767_225_600.0


def item(logic, key, event):
    """What the dataflow routes to a shard's logic: a batch of one (instance key, the
    event's experiment, the event)."""
    return [(key, logic.store.context.registry.current[event.experiment], event)]


def registry(arms, extra=""):
    names = ", ".join(f'"{a}"' for a in arms)
    return Registry.from_toml(f"[experiments.e]\narms = [{names}]\nfeedback_ttl = 100\n{extra}")


def request(rid, **extra):
    raw = orjson.dumps({"experiment": "e", "request_id": rid, **extra})
    return parse_request(raw, Origin("t", 0, 1))


def feedback(rid, loss, **extra):
    raw = orjson.dumps({"experiment": "e", "request_id": rid, "loss": loss, **extra})
    return parse_feedback(raw, Origin("t", 0, 2))


def trained(reg, rounds=300, open_requests=()):
    """A logic that learned arm 'b' is best (loss 0 vs 10), then served ``open_requests``."""
    logic = logic_builder(reg, clock=lambda: T0)(None)
    for i in range(rounds):
        [sel] = logic.handle(item(logic, "e", request(f"r{i}")))
        logic.handle(item(logic, "e", feedback(f"r{i}", 0.0 if sel.arm_name == "b" else 10.0)))
    served = {
        rid: next(iter(logic.handle(item(logic, "e", request(rid))))) for rid in open_requests
    }
    return logic, served


def one(logic):
    """The instance of experiment ``e`` a shard's logic holds (built if it rests: one
    holding kept answers rests once its snapshot is taken)."""
    if "e" not in logic.store.instances:
        logic.store.bind(logic.store.context.registry.current["e"], "e")
    return logic.store.instances["e"]


def probabilities(logic):
    return dict(zip(one(logic).experiment.arms, one(logic).bandit.probabilities(), strict=True))


def learned(logic):
    """p = w/Σw, the learned part of q = (1 - ε)·p + ε/M."""
    return dict(zip(one(logic).experiment.arms, one(logic).bandit.weight_shares(), strict=True))


def test_an_appended_arm_keeps_what_was_learned_and_is_explored():
    logic, _ = trained(registry("abcd"))
    before = learned(logic)
    resumed = logic_builder(registry("abcde"), clock=lambda: T0)(logic.snapshot())
    after = learned(resumed)
    assert one(resumed).bandit.n_updates == one(logic).bandit.n_updates == 300
    assert max(after, key=after.get) == "b"  # still the learned favourite
    # kept arms keep their cumulative losses; the default γ = sqrt(log M) grew with M, so
    # weight ratios w_a/w_b = exp(-c·(Φ_a - Φ_b)) take the power γ(5 arms)/γ(4 arms)
    power = one(resumed).bandit.gamma / one(logic).bandit.gamma
    ratios = [after[a] / after["b"] for a in "acd"]
    assert ratios == pytest.approx([(before[a] / before["b"]) ** power for a in "acd"], rel=1e-6)
    assert one(resumed).bandit.probabilities()[4] > 0  # the new arm is explored (ε mixing)
    again = logic_builder(registry("abcde"), clock=lambda: T0)(resumed.snapshot())
    assert again.snapshot() == resumed.snapshot()  # packs and restores in its new shape


def test_new_arm_share_sets_the_new_arms_weight():
    logic, _ = trained(registry("abcd"))
    resumed = logic_builder(registry("abcde", "new_arm_share = 0.25"))(logic.snapshot())
    p = one(resumed).bandit.probabilities()
    eps_part = p.min()  # the ε/M floor; q = (1 - ε)·p + ε/M
    assert p[4] > 0.2 and p[4] > eps_part


def test_a_retired_arm_closes_its_open_tickets_with_a_dead_letter():
    # robust: its ε floor leaves open tickets on the losing arms too (the default, bobw,
    # has no forced exploration and plays only 'b' once it has learned)
    robust = 'variant = "robust"'
    logic, served = trained(registry("abcd", robust), open_requests=[f"o{i}" for i in range(40)])
    on_c = [rid for rid, sel in served.items() if sel.arm_name == "c"]
    on_b = [rid for rid, sel in served.items() if sel.arm_name == "b"]
    assert on_c and on_b
    resumed = logic_builder(registry("abd", robust), clock=lambda: T0)(logic.snapshot())
    assert resumed.notify_at() is not None  # asks to be woken to hand out its dead letters
    out = resumed.wake()
    letters = [d for d in out if isinstance(d, DeadLetter)]
    assert sorted(orjson.loads(d.raw)["request_id"] for d in letters) == sorted(on_c)
    assert {d.reason for d in letters} == {"arm_retired"} and not resumed.wake()
    # a ticket on a kept arm is remapped by name: its retry and its feedback still work
    rid = on_b[0]
    [again] = resumed.handle(item(resumed, "e", request(rid)))
    assert again.arm_name == "b" and again.arm == 1 and again.prob == served[rid].prob
    assert list(resumed.handle(item(resumed, "e", feedback(rid, 1.0, arm="b")))) == []
    assert one(resumed).bandit.n_updates == 301
    assert 2 in one(resumed).bandit.probabilities().nonzero()[0]  # 'd' is index 2 now


def test_reordered_and_renamed_arms_are_matched_by_name():
    logic, served = trained(registry("abcd"), open_requests=["x"])
    before = probabilities(logic)
    new = registry(["d", "lime", "a", "c"], 'renamed_arms = { b = "lime" }')
    resumed = logic_builder(new, clock=lambda: T0)(logic.snapshot())
    after = probabilities(resumed)
    for old, name in (("a", "a"), ("b", "lime"), ("c", "c"), ("d", "d")):
        assert after[name] == pytest.approx(before[old], rel=1e-9)
    [again] = resumed.handle(item(resumed, "e", request("x")))
    old_name = served["x"].arm_name
    assert again.arm_name == ("lime" if old_name == "b" else old_name)


def test_a_changed_competition_keeps_the_arm_distribution():
    """p, the weights' distribution before any exploration floor (the default's Fixed class
    has none, its Switching class has robust's)."""
    logic, _ = trained(registry("abcd"))
    before = one(logic).bandit.weight_shares()
    switching = registry("abcd", 'competition = { kind = "switching", rate = 0.01 }')
    resumed = logic_builder(switching, clock=lambda: T0)(logic.snapshot())
    np.testing.assert_allclose(one(resumed).bandit.weight_shares(), before, rtol=1e-9)
    assert one(resumed).bandit.competition.to_dict()["kind"] == "switching"
    contextual = registry("abcd", 'competition = { kind = "contextual", n_contexts = 2 }')
    resumed = logic_builder(contextual, clock=lambda: T0)(logic.snapshot())
    for context in (0, 1):
        np.testing.assert_allclose(one(resumed).bandit.weight_shares(context), before, rtol=1e-9)
    [sel] = resumed.handle(item(resumed, "e", request("ctx", context=1)))
    assert isinstance(sel, Selection)


def test_a_removed_experiment_is_archived_and_comes_back():
    logic, _ = trained(registry("abcd"))
    state = logic.snapshot()
    other = Registry.from_toml('[experiments.f]\narms = ["x"]')
    archived = logic_builder(other)(state)
    assert not archived.store.instances and archived.snapshot() == state  # kept, not dropped
    back = logic_builder(registry("abcd"), clock=lambda: T0)(archived.snapshot())
    assert one(back).bandit.n_updates == 300


def test_a_live_reload_applies_on_the_next_event(tmp_path):
    path = tmp_path / "registry.toml"
    path.write_text('[experiments.e]\narms = ["a", "b", "c", "d"]\nfeedback_ttl = 100\n')
    live = LiveRegistry(Registry.load(path), path)
    logic = logic_builder(live, clock=lambda: T0)(None)
    [sel] = logic.handle(item(logic, "e", request("r1")))
    path.write_text("[experiments.e]\narms = [")  # a broken edit: refused, nothing changes
    assert "refused" in live.reload() and not live.apply()
    path.write_text('[experiments.e]\narms = ["d", "c", "b", "a", "e"]\nfeedback_ttl = 100\n')
    assert "reloaded" in live.reload()
    assert one(logic).experiment.arms == ("a", "b", "c", "d")  # not before the epoch closes
    assert live.apply()
    [again] = logic.handle(item(logic, "e", request("r1")))
    assert again.arm_name == sel.arm_name and one(logic).experiment.arms[-1] == "e"


@pytest.mark.parametrize("arms", ["abcde", "dcba", "abd"])
def test_an_instance_resting_on_its_ticket_follows_a_change_when_built(arms):
    """Packed under the old definition and waiting on one ticket, an instance is built
    under the new one on its next event or its deadline, as a live one would follow it."""
    seen = []
    for rest_after in (0.0, 1e9):  # put to rest at every call, or never
        now = [T0]
        live = LiveRegistry(registry("abcd"))
        logic = logic_builder(live, clock=lambda now=now: now[0], rest_after=rest_after)(None)
        out = [logic.handle(item(logic, "e", request(f"r{i}")))[0].arm_name for i in range(8)]
        for i in range(8):
            logic.handle(item(logic, "e", feedback(f"r{i}", float(i % 3))))
        now[0] += 200.0  # the answers kept for retries (retry window = TTL, 100 s) go
        out += [d.reason for d in logic.wake()]
        out += [s.arm_name for s in logic.handle(item(logic, "e", request("r8")))]
        for _ in range(3):
            logic.handle([])
        assert ("e" in logic.store.resting) == (rest_after == 0.0)  # waiting on r8 alone
        live.current = registry(arms)
        out += [(d.reason, orjson.loads(d.raw)["request_id"]) for d in logic.wake()]
        out += [s.arm_name for s in logic.handle(item(logic, "e", request("r9")))]
        fed = logic.handle(item(logic, "e", feedback("r8", 1.0)))
        out += [(type(o).__name__, getattr(o, "reason", None)) for o in fed]
        seen.append((out, probabilities(logic)))
    assert seen[0] == seen[1]


def test_a_migration_error_is_a_dead_letter_not_a_crash(monkeypatch):
    logic, _ = trained(registry("abcd"))
    live = LiveRegistry(registry("abcd"))
    logic.store.context = FlowContext(live)

    def broken(*_args, **_kwargs):
        raise RuntimeError("bad migration")

    monkeypatch.setattr("flows.service.instances.instance.migrate", broken)
    live.current = registry("abcde")
    [dead] = logic.handle(item(logic, "e", request("z")))
    assert dead.reason == "internal_error" and "bad migration" in dead.detail


def test_inspect_reads_old_snapshots_with_old_and_new_registries():
    logic, _ = trained(registry("abcd"))
    [state] = [state_of(entry) for entry in logic.snapshot()["entries"]]
    for reg in (None, registry("abcd"), registry("abcde"), registry("ab")):
        view = describe("e", state, reg)
        assert view.arms == list("abcd") and len(view.q[0]) == 4
        assert "b=" in render([view])
    gone = describe("e", state, Registry.from_toml('[experiments.f]\narms = ["x"]'))
    assert gone.archived and "archived" in render([gone])
    old_format = {k: v for k, v in state.items() if k != "arms"}  # before names were kept
    assert describe("e", old_format, registry("abcde")).arms == ["#0", "#1", "#2", "#3"]


def test_a_changed_variant_keeps_what_was_learned_and_runs_the_new_algorithm():
    logic, _ = trained(registry("abcd", 'variant = "paper"'))
    learned_paper = one(logic).bandit
    robust = registry("abcd", 'variant = "robust"')
    resumed = logic_builder(robust, clock=lambda: T0)(logic.snapshot())
    bandit = one(resumed).bandit
    assert bandit.variant.name == "robust" and learned_paper.variant.name == "paper"
    assert bandit.n_updates == learned_paper.n_updates
    assert max(learned(resumed), key=learned(resumed).get) == "b"
    [sel] = resumed.handle(item(resumed, "e", request("after")))
    assert isinstance(sel, Selection)
    resumed.handle(item(resumed, "e", feedback("after", 3.0)))
    assert one(resumed).bandit.n_updates == learned_paper.n_updates + 1


@pytest.mark.parametrize(("value", "shown"), [('"fast"', "'fast'"), ("3", "3")])
def test_an_unknown_variant_is_refused_naming_it(value, shown):
    with pytest.raises(RegistryError, match=shown):
        registry("ab", f"variant = {value}")


def test_an_unpickled_experiment_is_this_processs_own_of_its_definition():
    """Events cross Bytewax processes pickled with their experiment: each unpickles as the
    experiment of the same definition the receiving flow reads, or, for a definition it
    does not know (a reload not yet applied there), as one object per definition while
    something holds it; never as the object of another definition."""
    text = '[experiments.e]\narms = ["a", "b"]\nper_unit = true\nseed = 81\n'
    live = LiveRegistry(Registry.from_toml(text))
    sent = Registry.from_toml(text)["e"]  # another process's object
    assert sent is not live.current["e"]
    assert pickle.loads(pickle.dumps(sent)) is live.current["e"]

    changed = Registry.from_toml(text.replace("seed = 81", "seed = 82"))["e"]
    first = pickle.loads(pickle.dumps(changed))
    assert first is not live.current["e"] and first.seed == 82
    assert first.definition == changed.definition
    assert pickle.loads(pickle.dumps(changed)) is first
    assert first.new_bandit("e\x1fu").to_dict() == changed.new_bandit("e\x1fu").to_dict()

    live._pending = Registry.from_toml(text)  # a reload of the same definition, applied
    assert live.apply()
    assert pickle.loads(pickle.dumps(sent)) is live.current["e"]


def test_experiments_of_different_competitions_have_different_definitions():
    """The definition text tells apart what an experiment's bandits depend on: a
    Markov prior's matrix, a float's last digit."""
    base = '[experiments.e]\narms = ["a", "b"]\n'
    texts = [
        base,
        base + "gamma = 1.5\n",
        base + "gamma = 1.5000000000000002\n",
        base + 'competition = { kind = "switching", rate = 0.001 }\n',
        base + 'competition = { kind = "markov", transition = [[0.9, 0.1], [0.1, 0.9]], '
        "arm_of = [0, 1] }\n",
        base + 'competition = { kind = "markov", transition = [[0.8, 0.2], [0.1, 0.9]], '
        "arm_of = [0, 1] }\n",
    ]
    definitions = [Registry.from_toml(text)["e"].definition for text in texts]
    assert len(set(definitions)) == len(texts)
    again = [Registry.from_toml(text)["e"].definition for text in texts]
    assert again == definitions
