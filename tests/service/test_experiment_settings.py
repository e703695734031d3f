"""The registry's serving settings (default_loss, aggregate, min_share, holdout, burn_in,
force_arm) and named contexts: each valid value read, each invalid one refused naming it,
and which edits migrate what was learned (arms, competition, contexts) and which apply
at once without touching it (the serving settings)."""

import orjson
import pytest

from flows.service.instances.instance import Instance
from flows.service.instances.registry import LiveRegistry, Registry, RegistryError
from flows.service.wire.events import Origin, parse_feedback, parse_request
from tsi_core import Allocation

BASE = '[experiments.e]\narms = ["control", "green", "blue"]\n'


def experiment(extra=""):
    return Registry.from_toml(BASE + extra)["e"]


def test_defaults_are_todays_behaviour():
    e = experiment()
    assert (e.default_loss, e.aggregate, e.contexts) == (None, "first", None)
    assert e.allocation == Allocation()


@pytest.mark.parametrize(
    ("extra", "read"),
    [
        ("default_loss = 1", {"default_loss": 1.0}),
        ("default_loss = -2.5", {"default_loss": -2.5}),
        ('aggregate = "sum"', {"aggregate": "sum"}),
        ('aggregate = "mean"', {"aggregate": "mean"}),
        ('aggregate = "last"', {"aggregate": "last"}),
        ('aggregate = "max"', {"aggregate": "max"}),
        ("min_share = 0.02", {"min_share": 0.02}),
        ('holdout = { arm = "control", share = 0.1 }', {"holdout": ("control", 0.1)}),
        ("burn_in = 500", {"burn_in": 500}),
        ('force_arm = "blue"', {"force_arm": "blue"}),
    ],
)
def test_each_serving_setting_is_read(extra, read):
    e = experiment(extra)
    for name, value in read.items():
        assert getattr(e, name) == value


def test_the_allocation_names_arms_by_index():
    e = experiment(
        'min_share = 0.05\nholdout = { arm = "green", share = 0.2 }\nburn_in = 7\n'
        'force_arm = "blue"'
    )
    assert e.allocation == Allocation(
        min_share=0.05, holdout_arm=1, holdout_share=0.2, burn_in=7, force_arm=2
    )


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ("default_loss = nan", "default_loss"),
        ("default_loss = inf", "default_loss"),
        ('default_loss = "1"', "default_loss"),
        ("default_loss = true", "default_loss"),
        ('aggregate = "median"', "aggregate"),
        ("aggregate = 1", "aggregate"),
        ("min_share = -0.1", "min_share"),
        ("min_share = 0.34", "min_share"),  # 3 arms x 0.34 >= 1
        ('min_share = "x"', "min_share"),
        ('holdout = { arm = "red", share = 0.1 }', "holdout arm 'red'"),
        ('holdout = { arm = "control", share = 0 }', "holdout share"),
        ('holdout = { arm = "control", share = 1 }', "holdout share"),
        ('holdout = { arm = "control" }', "holdout must be"),
        ('holdout = { arm = "control", share = 0.1, x = 1 }', "holdout must be"),
        ('holdout = "control"', "holdout must be"),
        ("burn_in = -1", "burn_in"),
        ("burn_in = 1.5", "burn_in"),
        ("burn_in = true", "burn_in"),
        ('force_arm = "red"', "force_arm 'red'"),
        ("force_arm = 1", "force_arm 1"),
        ("contexts = {}", "contexts must be"),
        ('contexts = "device"', "contexts must be"),
        ("contexts = { device = [] }", "contexts attribute 'device'"),
        ('contexts = { device = ["ios", "ios"] }', "contexts attribute 'device'"),
        ("contexts = { device = [1, 2] }", "contexts attribute 'device'"),
        (
            'contexts = { device = ["ios"] }\ncompetition = "fixed"',
            "contexts make the competition",
        ),
        (
            'contexts = { device = ["ios"] }\n'
            'competition = { kind = "contextual", n_contexts = 3 }',
            "contexts make the competition",
        ),
    ],
)
def test_each_invalid_value_is_refused_naming_it(extra, named):
    with pytest.raises(RegistryError) as refused:
        experiment(extra)
    assert "experiment 'e'" in str(refused.value)
    assert named in str(refused.value)


def test_named_contexts_make_the_contextual_class_over_their_product():
    e = experiment('contexts = { device = ["ios", "android", "web"], plan = ["free", "pro"] }')
    assert e.competition.to_dict() == {"kind": "contextual", "n_contexts": 4 * 3}
    assert e.contexts.index({"device": "ios", "plan": "free"}) == (0, ())
    assert e.contexts.index({"device": "web", "plan": "pro"}) == (2 * 3 + 1, ())
    assert e.contexts.index({"device": "tv", "plan": "trial"}) == (11, ("device", "plan"))
    same = experiment(
        'contexts = { device = ["ios", "android", "web"], plan = ["free", "pro"] }\n'
        'competition = { kind = "contextual", n_contexts = 12 }'
    )
    assert same.competition == e.competition


def request(rid, **fields):
    raw = {"experiment": "e", "request_id": rid, **fields}
    return parse_request(orjson.dumps(raw), Origin("t"))


def feedback(rid, loss):
    raw = {"experiment": "e", "request_id": rid, "loss": loss}
    return parse_feedback(orjson.dumps(raw), Origin("t"))


def learned(extra="", n=30):
    """An instance of experiment(extra) that served and learned n requests."""
    inst = Instance(experiment(extra), "e")
    for i in range(n):
        [sel] = inst.on_request(request(f"r{i}"), 0.0)
        inst.on_feedback(feedback(f"r{i}", float(sel.arm == 0)), 1.0)
    return inst


SERVING_EDITS = [
    "default_loss = 1",
    'aggregate = "max"',
    "min_share = 0.1",
    'holdout = { arm = "control", share = 0.2 }',
    "burn_in = 50",
    'force_arm = "blue"',
    "feedback_ttl = 5",
    "retry_window = 9",
]


@pytest.mark.parametrize("edit", SERVING_EDITS)
def test_a_serving_edit_keeps_what_was_learned_and_applies_at_once(edit):
    inst = learned()
    before = inst.bandit.to_dict()
    edited = experiment(edit)
    inst.follow(edited)
    after = inst.bandit.to_dict()
    assert after.pop("allocation") == edited.template.to_dict()["allocation"]
    before.pop("allocation")
    assert after == before  # nothing learned changed
    assert inst.bandit.allocation == edited.allocation
    assert inst.experiment is edited


LEARNED = ("psi", "vn", "d_mant", "d_exp", "n_updates", "weights")


def test_forcing_an_arm_learns_nothing_and_removing_it_resumes():
    inst = learned()
    before = inst.bandit.to_dict()
    inst.follow(experiment('force_arm = "blue"'))
    for i in range(20):
        [sel] = inst.on_request(request(f"f{i}"), 2.0)
        assert (sel.arm_name, sel.why, sel.prob) == ("blue", "forced", 1.0)
        assert inst.on_feedback(feedback(f"f{i}", 5.0), 3.0).applied == 1  # settled
    inst.follow(experiment())
    resumed = inst.bandit.to_dict()
    assert {k: resumed[k] for k in LEARNED} == {k: before[k] for k in LEARNED}
    assert resumed["pending"] == []
    [sel] = inst.on_request(request("back"), 4.0)
    assert sel.why == "bandit"


@pytest.mark.parametrize(
    "edit",
    [
        'arms = ["control", "green", "blue", "red"]',
        'competition = { kind = "switching", rate = 0.01 }',
        'contexts = { device = ["ios"] }',
    ],
)
def test_a_definition_edit_migrates(edit):
    inst = learned()
    text = BASE.replace('arms = ["control", "green", "blue"]\n', "") if "arms" in edit else BASE
    edited = Registry.from_toml(text + edit)["e"]
    assert not edited.same_state_as(inst.experiment.arms, inst.bandit)
    inst.follow(edited)
    assert inst.bandit.n_arms == len(edited.arms)
    assert inst.bandit.n_updates == 30
    assert inst.bandit.competition.to_dict() == edited.competition.to_dict()


@pytest.mark.parametrize(
    "bad", ["min_share = 0.5", 'aggregate = "median"', 'force_arm = "red"', "burn_in = -3"]
)
def test_a_reload_with_a_bad_value_keeps_the_running_registry(tmp_path, bad):
    path = tmp_path / "registry.toml"
    path.write_text(BASE + "min_share = 0.1")
    live = LiveRegistry(Registry.load(path), path)
    path.write_text(BASE + bad)
    said = live.reload()
    assert "reload refused, the running registry stays" in said
    assert bad.split(" = ")[0] in said
    assert not live.apply() and live.current["e"].min_share == 0.1
