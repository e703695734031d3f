"""Instance keys and shard addressing (``flows.service.wire.keys``, compiled): one body, which
the parser's compiled lane calls too."""

import doctest
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.service.wire import keys
from flows.service.wire.keys import SHARD_NAMES, SHARDS, instance_key, shard_of, split_key


@given(st.text(max_size=64), st.integers(1, 300))
def test_a_key_is_routed_by_zlibs_crc32_of_its_utf8(key, shards):
    """The shard of a key is fixed for good (a store's layout depends on it): zlib's
    CRC-32 of the key's UTF-8, ASCII or not, whatever the shard count."""
    crc = zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if any(0xD800 <= ord(c) <= 0xDFFF for c in key):
        return  # not valid UTF-8: never a key (the parser refuses it first)
    assert shard_of(key) == SHARD_NAMES[crc % SHARDS]
    assert shard_of(key, shards) == keys.shard_name(crc % shards, shards)


@given(st.text(min_size=1, max_size=20).filter(lambda s: "\x1f" not in s), st.text(max_size=20))
def test_an_instance_key_splits_back_into_its_parts(experiment, unit):
    assert split_key(instance_key(experiment, unit)) == (experiment, unit)
    assert split_key(instance_key(experiment, None)) == (experiment, None)


def test_a_shard_count_below_one_is_refused_by_name():
    with pytest.raises(ValueError, match="shards must be 1 or more, got 0"):
        shard_of("e", 0)


def test_the_modules_examples_hold():
    """pytest's --doctest-modules does not read compiled modules: run the examples here."""
    result = doctest.testmod(keys)
    assert result.attempted > 0 and result.failed == 0
