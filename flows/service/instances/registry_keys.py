"""The keys of an experiment's table in the registry, declared once: their meaning, an
example value and the JSON schema of the value. The registry's parser refuses any other
key (``registry.KNOWN_SETTINGS``), the experiments API's OpenAPI document describes a spec
with these (``spec_schema``) and the documentation's reference page lists them. A leaf: it
imports nothing of the service.

>>> [key.name for key in KEYS][:3]
['arms', 'competition', 'gamma']
>>> print(example_table("checkout").splitlines()[1])
arms = ["control", "green", "blue"]   # the arms' names, in order
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["KEYS", "RegistryKey", "example_table", "spec_schema"]

_NUMBER = {"type": "number"}
_TEXT = {"type": "string", "minLength": 1}


@dataclass(frozen=True)
class RegistryKey:
    """One key: its ``name``, what it ``means``, an ``example`` value (TOML) and the JSON
    ``schema`` of its value."""

    name: str
    means: str
    example: str
    schema: dict[str, Any]


KEYS: tuple[RegistryKey, ...] = (
    RegistryKey(
        "arms",
        "the arms' names, in order",
        '["control", "green", "blue"]',
        {"type": "array", "items": _TEXT, "minItems": 1},
    ),
    RegistryKey(
        "competition",
        "the class of arm sequences it competes with: fixed | switching | contextual | markov",
        '{ kind = "switching", rate = 0.001 }',
        {"type": ["object", "string"]},
    ),
    RegistryKey("gamma", "optional, default sqrt(W) of the class", "1.5", _NUMBER),
    RegistryKey(
        "variant",
        'optional: the algorithm, a preset of tsi_core.variant (default "bobw")',
        '"bobw"',
        {"type": ["string", "object"]},
    ),
    RegistryKey("feedback_ttl", "seconds a selection waits for its feedback", "3600", _NUMBER),
    RegistryKey(
        "retry_window",
        "seconds an answer is kept for retries after its feedback or expiry",
        "3600",
        _NUMBER,
    ),
    RegistryKey(
        "per_unit",
        "one bandit per unit (user), or one shared by the experiment",
        "true",
        {"type": "boolean"},
    ),
    RegistryKey("seed", "seeds the hashed draws", "42", {"type": "integer"}),
    RegistryKey(
        "early_feedback_limit",
        "feedback waiting for its request, per instance",
        "1000",
        {"type": "integer", "minimum": 0},
    ),
    RegistryKey(
        "new_arm_share",
        "optional: p of an arm added later (default: the mean log-weight)",
        "0.1",
        _NUMBER,
    ),
    RegistryKey(
        "renamed_arms",
        'optional: the arm now called "green" was called "lime"',
        '{ lime = "green" }',
        {"type": "object", "additionalProperties": _TEXT},
    ),
    RegistryKey(
        "default_loss", "optional: the loss of a window closed without feedback", "1.0", _NUMBER
    ),
    RegistryKey(
        "aggregate",
        "a window's feedback combined: first | sum | mean | last | max",
        '"first"',
        {"enum": ["first", "sum", "mean", "last", "max"]},
    ),
    RegistryKey(
        "min_share",
        "optional: every arm served with probability >= this",
        "0.02",
        {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    ),
    RegistryKey(
        "holdout",
        "optional: a share of requests held out to one arm",
        '{ arm = "control", share = 0.1 }',
        {
            "type": "object",
            "properties": {"arm": _TEXT, "share": _NUMBER},
            "required": ["arm", "share"],
        },
    ),
    RegistryKey(
        "burn_in",
        "optional: an instance's first requests served uniformly",
        "500",
        {"type": "integer", "minimum": 0},
    ),
    RegistryKey(
        "force_arm", "optional: everyone gets this arm, nothing is learned", '"control"', _TEXT
    ),
    RegistryKey(
        "contexts",
        "named contexts: each attribute and its values",
        '{ device = ["ios", "android"], plan = ["free", "pro"] }',
        {"type": "object", "additionalProperties": {"type": "array", "items": _TEXT}},
    ),
    RegistryKey(
        "guardrails",
        "optional, needs a holdout: metrics sent with feedback, tested against the holdout",
        '[{ metric = "latency_ms", worse = "higher" }]',
        {"type": "array", "items": {"type": "object", "required": ["metric"]}},
    ),
)


def spec_schema() -> dict[str, Any]:
    """The JSON schema of an experiment's spec (the keys of one table).

    >>> schema = spec_schema()
    >>> schema["required"], schema["additionalProperties"], "holdout" in schema["properties"]
    (['arms'], False, True)
    """
    return {
        "type": "object",
        "description": "the keys of one [experiments.NAME] table of the registry",
        "properties": {key.name: {**key.schema, "description": key.means} for key in KEYS},
        "required": ["arms"],
        "additionalProperties": False,
    }


def example_table(name: str) -> str:
    """A table holding every key, each with its example value and meaning (TOML)."""
    lines = [f"[experiments.{name}]"]
    lines += [f"{key.name} = {key.example}   # {key.means}" for key in KEYS]
    return "\n".join(lines) + "\n"
