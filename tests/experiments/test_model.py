"""The pure model of experiments as resources: versions, no-op applies, audit replay,
refused transitions and hostile specs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.experiments.model import (
    MAX_SPEC_BYTES,
    ConflictError,
    ExperimentError,
    NotFoundError,
    Resource,
    apply,
    archive,
    pause,
    registry_of,
    replay,
    resume,
    stop,
)

ARMS = ["control", "green", "blue"]
SPECS = st.fixed_dictionaries(
    {"arms": st.sampled_from([ARMS, ARMS[:2], ["control", "blue"]])},
    optional={
        "feedback_ttl": st.integers(1, 10_000),
        "seed": st.integers(0, 100),
        "min_share": st.sampled_from([0.0, 0.01, 0.1]),
        "burn_in": st.integers(0, 50),
    },
)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("apply"), SPECS),
        st.tuples(st.just("pause"), st.sampled_from([None, "control", "blue"])),
        st.tuples(st.just("stop"), st.sampled_from(["control", "blue"])),
        st.tuples(st.just("resume"), st.none()),
        st.tuples(st.just("archive"), st.none()),
    ),
    max_size=12,
)


def _step(current, step):
    what, value = step
    if what == "apply":
        return apply(current, "exp", value, "ann")
    if what == "pause":
        return pause(current, "bob", value)
    if what == "stop":
        return stop(current, value, "cy")
    return {"resume": resume, "archive": archive}[what](current, "dee")


@settings(max_examples=150, deadline=None)
@given(first=SPECS, steps=STEPS)
def test_versions_count_real_changes_and_the_audits_replay_to_the_resource(first, steps):
    """Each accepted change adds one to the version and leaves an audit of that version;
    a refused one changes nothing; the audits' diffs, replayed, give the resource."""
    current, audit = apply(None, "exp", first, "ann")
    audits = [audit]
    for step in steps:
        before = current
        try:
            current, audit = _step(current, step)
        except ExperimentError:
            assert current is before
            continue
        if audit is None:
            assert current is before
            continue
        assert current.version == before.version + 1 == audit.version
        assert audit.diff and audit.experiment == "exp"
        audits.append(audit)
        assert Resource.from_json(current.to_json()) == current
    assert replay(audits) == current.fields()
    assert [a.version for a in audits] == list(range(1, current.version + 1))


@settings(max_examples=50, deadline=None)
@given(spec=SPECS)
def test_an_unchanged_apply_is_a_no_op(spec):
    made, _ = apply(None, "exp", spec, "ann")
    again, audit = apply(made, "exp", dict(spec), "bob")
    assert audit is None and again is made


def test_pause_forces_the_control_arm_and_resume_removes_it():
    made, _ = apply(None, "exp", {"arms": ARMS}, "ann")
    paused, audit = pause(made, "bob")
    assert registry_of([paused])["exp"].force_arm == "control"
    assert audit.who == "bob" and audit.when.endswith("+00:00") and audit.action == "pause"
    assert audit.diff == {"status": ["active", "paused"], "arm": [None, "control"]}
    resumed, _ = resume(paused, "bob")
    assert registry_of([resumed])["exp"].force_arm is None and resumed.version == 3
    stopped, _ = stop(resumed, "blue", "bob")
    assert registry_of([stopped])["exp"].force_arm == "blue"
    archived, _ = archive(stopped, "bob")
    assert registry_of([archived]).experiments == {} and archived.spec == made.spec


def test_a_spec_with_its_own_force_arm_keeps_it_after_resume():
    made, _ = apply(None, "exp", {"arms": ARMS, "force_arm": "green"}, "ann")
    resumed, _ = resume(pause(made, "bob")[0], "bob")
    assert registry_of([resumed])["exp"].force_arm == "green"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: resume(r, "ann"), "is active already"),
        (lambda r: stop(r, "purple", "ann"), "has no arm 'purple'"),
        (lambda r: pause(r, "ann", "purple"), "has no arm 'purple'"),
        (lambda r: pause(pause(r, "ann")[0], "ann"), "is paused, not active"),
        (lambda r: pause(archive(r, "ann")[0], "ann"), "is archived"),
        (lambda r: apply(archive(r, "ann")[0], "exp", {"arms": ["a"]}, "ann"), "is archived"),
        (lambda r: archive(archive(r, "ann")[0], "ann"), "is archived"),
        (lambda r: apply(r, "exp", {"arms": ["x"]}, "ann", expected_version=7), "version 1"),
        (lambda r: apply(r, "exp", {"arms": ["x"]}, ""), "who must be"),
        (lambda r: pause(None, "ann"), "no experiment"),
    ],
)
def test_bad_transitions_are_refused_naming_why(call, message):
    made, _ = apply(None, "exp", {"arms": ARMS}, "ann")
    kept = made.to_json()
    with pytest.raises(ExperimentError, match=message):
        call(made)
    assert made.to_json() == kept


def test_a_version_mismatch_is_a_conflict_naming_both_versions():
    made, _ = apply(None, "exp", {"arms": ARMS}, "ann")
    with pytest.raises(ConflictError, match="at version 1, not the expected 0"):
        apply(made, "exp", {"arms": ["x"]}, "ann", expected_version=0)
    with pytest.raises(NotFoundError):
        resume(None, "ann")
    assert apply(made, "exp", {"arms": ["x"]}, "ann", expected_version=1)[0].version == 2


def test_a_change_that_drops_the_forced_arm_is_refused():
    paused, _ = pause(apply(None, "exp", {"arms": ARMS}, "ann")[0], "ann", "blue")
    with pytest.raises(ExperimentError, match="force_arm"):
        apply(paused, "exp", {"arms": ["control", "green"]}, "ann")


@pytest.mark.parametrize(
    ("name", "spec", "message"),
    [
        ("a/b", {"arms": ["a"]}, "bad experiment name 'a/b'"),
        ("", {"arms": ["a"]}, "bad experiment name ''"),
        ("x" * 500, {"arms": ["a"]}, "bad experiment name"),
        (7, {"arms": ["a"]}, "bad experiment name 7"),
        ("e", {"arms": ["a"], "colour": 1}, "unknown setting colour"),
        ("e", {"arms": "a"}, "arms must be a non-empty list"),
        ("e", {"arms": ["a"], "feedback_ttl": "soon"}, "feedback_ttl must be"),
        ("e", {"arms": ["a"], "per_unit": 1}, "per_unit must be true or false"),
        ("e", {"arms": ["a"], "gamma": None}, "spec key 'gamma' is null"),
        ("e", {"arms": ["a"], "gamma": float("nan")}, "only finite numbers"),
        ("e", ["arms"], "must be a JSON object"),
        ("e", {"arms": [f"arm{i}" for i in range(20_000)]}, f"over the {MAX_SPEC_BYTES}"),
    ],
)
def test_hostile_specs_are_refused_naming_the_bad_value(name, spec, message):
    with pytest.raises(ExperimentError, match=message):
        apply(None, name, spec, "ann")


@pytest.mark.parametrize(
    "stored",
    [
        {"name": "e", "spec": {"arms": ["a"]}, "version": 1, "status": "sleeping"},
        {"name": "e", "spec": {"arms": ["a"]}, "version": "1"},
        {"name": "e", "spec": {"arms": ["a"]}, "version": 1, "status": "paused"},
        {"name": "e", "spec": {"arms": ["a"]}, "version": 1, "status": "paused", "arm": "z"},
        {"name": "e", "spec": {"arms": ["a"]}, "version": 1, "extra": 1},
        [1, 2],
    ],
)
def test_a_bad_stored_record_is_refused(stored):
    with pytest.raises(ExperimentError):
        Resource.from_json(stored)
