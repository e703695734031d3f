"""The registry's keys, declared once (``registry_keys``): the parser, the experiments API's
OpenAPI schema and the documentation's reference page all read the one declaration."""

from __future__ import annotations

import tomllib

import pytest

from flows.gateway.openapi import openapi
from flows.service.instances.registry import KNOWN_SETTINGS, Registry, RegistryError
from flows.service.instances.registry_keys import KEYS, example_table, spec_schema

#: Two keys that say the same thing: contexts make the competition.
EXCLUSIVE = {"competition": "contexts"}


def test_every_declared_key_is_what_the_parser_accepts():
    assert {key.name for key in KEYS} == KNOWN_SETTINGS
    assert len(KEYS) == len(KNOWN_SETTINGS)  # each declared once


@pytest.mark.parametrize("dropped", sorted(EXCLUSIVE))
def test_the_example_of_every_key_loads(dropped):
    """Each declared example is a value the parser takes (the table of them all, less the
    one key another one replaces)."""
    table = tomllib.loads(example_table("checkout"))["experiments"]["checkout"]
    del table[dropped]
    registry = Registry.from_dict({"experiments": {"checkout": table}})
    assert registry["checkout"].arms == ("control", "green", "blue")


def test_a_key_not_declared_is_refused_naming_it():
    with pytest.raises(RegistryError, match="holdout_share"):
        Registry.from_toml('[experiments.e]\narms = ["a", "b"]\nholdout_share = 0.1\n')


_TYPES = {"array": list, "object": dict, "string": str, "boolean": bool, "integer": int}


def _conforms(value, schema) -> bool:
    """The small part of JSON schema the declarations use: type and enum."""
    if "enum" in schema:
        return value in schema["enum"]
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return any(
        isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind == "number"
        else isinstance(value, _TYPES[kind]) and not (kind == "integer" and value is True)
        for kind in kinds
    )


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k.name)
def test_each_example_conforms_to_its_schema(key):
    value = tomllib.loads(f"x = {key.example}")["x"]
    assert _conforms(value, key.schema), (key.name, value, key.schema)
    assert not _conforms(object(), key.schema)


def test_the_api_describes_a_spec_with_the_declared_keys():
    put = openapi(experiments=True)["paths"]["/v1/experiments/{name}"]["put"]
    spec = put["requestBody"]["content"]["application/json"]["schema"]["properties"]["spec"]
    assert spec == spec_schema()
    assert set(spec["properties"]) == KNOWN_SETTINGS and spec["additionalProperties"] is False
