"""OpenFeature meets ``tsi serve``: the real OpenFeature SDK with its OFREP provider asks the
gateway, in front of a running service on the real broker, for the arm to serve."""

import pytest
from openfeature import api
from openfeature.contrib.provider.ofrep import OFREPProvider
from openfeature.evaluation_context import EvaluationContext
from openfeature.exception import ErrorCode
from openfeature.flag_evaluation import Reason
from openfeature.provider import AbstractProvider

from flows.gateway.body import MAX_BODY
from flows.service.instances.registry import Registry
from tests.client.service import REGISTRY, get, post
from tests.client.test_gateway import serve
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def gateway(service):
    """A gateway that reads the service's registry."""
    proc, port = serve(*service.options, "--registry", service.registry, "--decide-timeout", 20)
    yield port
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def flags(gateway):
    """An OpenFeature client whose provider is OFREP at the gateway."""
    api.set_provider(OFREPProvider(f"http://127.0.0.1:{gateway}", timeout=30), "tsi")
    yield api.get_client("tsi")
    api.clear_providers()


def test_a_flag_is_an_arm_drawn_by_the_bandit_and_its_feedback_applies(service, gateway, flags):
    details = flags.get_string_details("shop", "fallback", EvaluationContext("web-1"))
    assert details.error_code is None, details.error_message
    assert details.value in ("a", "b", "c") and details.variant == details.value
    assert details.reason == Reason.SPLIT
    metadata = details.flag_metadata
    assert 0 < metadata["prob"] <= 1 and metadata["why"] == "bandit"
    applied = 'tsi_feedback_total{experiment="shop",outcome="applied"}'
    before = service.metric(applied)
    feedback = {"experiment": "shop", "request_id": metadata["request_id"], "reward": 1}
    status, accepted = post(gateway, "/v1/feedback", {**feedback, "arm": details.value})
    assert status == 202, accepted
    wait_for(lambda: service.metric(applied) == before + 1, service.proc, 30, "feedback")


def test_named_contexts_per_unit_and_forced_arms(flags):
    """The attributes the experiment's contexts name are its context (others ignored); the
    targeting key is the unit; a forced arm is a static answer."""
    banner = EvaluationContext("u1", {"device": "ios", "email": "a@example.com"})
    details = flags.get_string_details("banner", "fallback", banner)
    assert (details.error_code, details.reason) == (None, Reason.SPLIT), details.error_message
    assert details.value in ("wide", "narrow")
    details = flags.get_string_details("basket", "fallback", EvaluationContext("u7"))
    assert details.error_code is None and details.value in ("x", "y"), details.error_message
    details = flags.get_string_details("promo", "fallback", EvaluationContext())
    assert (details.value, details.reason, details.flag_metadata["why"]) == (
        "on",
        Reason.STATIC,
        "forced",
    )


@pytest.mark.parametrize(
    ("flag", "context", "code", "named"),
    [
        ("nope", EvaluationContext("u1"), ErrorCode.FLAG_NOT_FOUND, "'nope'"),
        ("basket", EvaluationContext(), ErrorCode.TARGETING_KEY_MISSING, "targetingKey"),
        ("banner", EvaluationContext("u1"), ErrorCode.INVALID_CONTEXT, "'device' is missing"),
        ("banner", EvaluationContext("u1", {"device": 7}), ErrorCode.INVALID_CONTEXT, "7"),
    ],
)
def test_an_evaluation_that_cannot_be_made_is_the_sdks_error(flags, flag, context, code, named):
    details = flags.get_string_details(flag, "fallback", context)
    assert (details.value, details.reason, details.error_code) == ("fallback", Reason.ERROR, code)
    assert named in details.error_message


@pytest.mark.parametrize(
    ("body", "code", "named"),
    [
        (b"{not json", "PARSE_ERROR", "not JSON"),
        (b"[1]", "PARSE_ERROR", "must be a JSON object"),
        (b'"context"', "PARSE_ERROR", "must be a JSON object"),
        (b"[" * 5000 + b"]" * 5000, "PARSE_ERROR", "not JSON"),
        (b'{"context": 1e999}', "PARSE_ERROR", "not JSON"),
        (b'{"context": 123456789012345678901234567890}', "PARSE_ERROR", "context must be"),
        (b'{"context": [1]}', "PARSE_ERROR", "context must be a JSON object"),
        (b'{"contxt": {}}', "PARSE_ERROR", "field 'contxt' is unknown"),
        (b'{"context": {"%s": 1}}' % (b"x" * (MAX_BODY + 1)), "PARSE_ERROR", "over the"),
        (b'{"context": {"targetingKey": 5}}', "INVALID_CONTEXT", "targetingKey must be a string"),
        (b'{"context": {"targetingKey": {"a": 1}}}', "INVALID_CONTEXT", "targetingKey"),
        (b'{"context": {"targetingKey": "%s"}}' % (b"u" * 300), "INVALID_CONTEXT", "unit"),
    ],
)
def test_a_hostile_body_is_a_400_with_the_protocols_error(gateway, body, code, named):
    status, answer = post(gateway, "/ofrep/v1/evaluate/flags/shop", body)
    assert (status, answer["key"], answer["errorCode"]) == (400, "shop", code), answer
    assert named in answer["errorDetails"]
    status, answer = post(gateway, "/ofrep/v1/evaluate/flags", body)
    if code == "PARSE_ERROR":  # a bulk call's own failure, no key
        assert (status, answer["errorCode"]) == (400, code) and "key" not in answer, answer


def test_a_flag_key_no_experiment_can_have_is_not_found(gateway):
    status, answer = post(gateway, "/ofrep/v1/evaluate/flags/" + "k" * 300, {})
    assert (status, answer["errorCode"]) == (404, "FLAG_NOT_FOUND"), answer


def test_bulk_evaluation_answers_every_experiment_of_the_registry(gateway):
    context = {"targetingKey": "u9", "device": "web"}
    status, answer = post(gateway, "/ofrep/v1/evaluate/flags", {"context": context})
    assert status == 200, answer
    flags = {flag["key"]: flag for flag in answer["flags"]}
    assert set(flags) == set(Registry.from_toml(REGISTRY).experiments)
    assert {"shop", "basket", "banner", "promo"} <= set(flags)
    assert flags["promo"]["value"] == "on" and flags["promo"]["reason"] == "STATIC"
    assert all(flag["reason"] == "SPLIT" for key, flag in flags.items() if key != "promo")
    status, answer = post(gateway, "/ofrep/v1/evaluate/flags", {"context": {"device": "tv"}})
    flags = {flag["key"]: flag for flag in answer["flags"]}
    assert flags["basket"]["errorCode"] == "TARGETING_KEY_MISSING"  # its own failure
    assert flags["banner"]["value"] in ("wide", "narrow")  # "tv": the "other" slot


def test_without_the_registry_the_service_says_what_is_missing(service):
    """A gateway without --registry evaluates one flag at a time, the service's refusals
    as the protocol's errors; a bulk call says the registry is needed."""
    proc, port = serve(*service.options, "--decide-timeout", 20)
    try:
        status, answer = post(port, "/ofrep/v1/evaluate/flags/nope", {})
        assert (status, answer["errorCode"]) == (404, "FLAG_NOT_FOUND"), answer
        status, answer = post(port, "/ofrep/v1/evaluate/flags/basket", {"context": {}})
        assert (status, answer["errorCode"]) == (400, "TARGETING_KEY_MISSING"), answer
        banner = {"context": {"targetingKey": "u", "device": "ios"}}
        status, answer = post(port, "/ofrep/v1/evaluate/flags/banner", banner)
        assert (status, answer["value"] in ("wide", "narrow")) == (200, True), answer
        status, answer = post(port, "/ofrep/v1/evaluate/flags", {})
        assert (status, answer["errorCode"]) == (500, "GENERAL") and "--registry" in str(answer)
    finally:
        proc.kill()
        proc.wait()


def test_the_ofrep_provider_sends_no_tracking_events():
    """OFREP has no tracking call: the provider's ``track`` is the SDK's no-op, so feedback
    goes to ``POST /v1/feedback`` with the ``request_id`` of the flag's metadata."""
    assert OFREPProvider.track is AbstractProvider.track


def test_an_empty_body_is_an_empty_context(gateway):
    status, answer = post(gateway, "/ofrep/v1/evaluate/flags/promo", b"")
    assert (status, answer["value"], answer["variant"]) == (200, "on", "on"), answer


def test_the_openapi_document_describes_both_ofrep_routes(gateway):
    spec = get(gateway, "/openapi.json")[1]["paths"]
    one = spec["/ofrep/v1/evaluate/flags/{key}"]["post"]["responses"]
    assert set(one) == {"200", "400", "401", "403", "404", "500"}
    bulk = spec["/ofrep/v1/evaluate/flags"]["post"]["responses"]
    assert set(bulk) == {"200", "400", "401", "403", "500"}
