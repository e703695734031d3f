"""Instance keys and shard addressing (``flows.service.wire.keys``, compiled): one body, which
the parser's compiled lane calls too."""

import doctest
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.service.wire import keys
from flows.service.wire.keys import (
    DEFAULT_SHARDS,
    instance_key,
    of_layout,
    shard_index,
    shard_layout,
    shard_name,
    shard_names,
    shard_of,
    split_key,
)

#: Keys as the service makes them: ASCII or not, with a unit or not (no surrogates: the
#: parser refuses text that is not UTF-8 before any key is made).
KEYS = st.builds(
    instance_key, st.text(min_size=1, max_size=20), st.none() | st.text(max_size=20)
).filter(lambda key: not any(0xD800 <= ord(c) <= 0xDFFF for c in key))


@given(st.text(max_size=64), st.integers(1, 300))
def test_a_key_is_routed_by_zlibs_crc32_of_its_utf8(key, shards):
    """The shard of a key is fixed for good (a store's layout depends on it): zlib's
    CRC-32 of the key's UTF-8, ASCII or not, whatever the shard count."""
    crc = zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if any(0xD800 <= ord(c) <= 0xDFFF for c in key):
        return  # not valid UTF-8: never a key (the parser refuses it first)
    assert shard_of(key) == shard_names(DEFAULT_SHARDS)[crc % DEFAULT_SHARDS]
    assert shard_of(key, shards) == keys.shard_name(crc % shards, shards)


@given(KEYS, st.integers(1, 1024))
def test_a_keys_shard_index_lies_within_the_count_and_names_its_shard(key, shards):
    index = shard_index(key, shards)
    assert 0 <= index < shards
    assert shard_of(key, shards) == shard_name(index, shards)
    assert shard_layout(shard_of(key, shards)) == (index, shards)
    assert of_layout(shard_of(key, shards), shards)
    assert not of_layout(shard_of(key, shards), shards + 1)


@given(KEYS, st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.sampled_from([1, 2, 4, 8, 16]))
def test_with_partitions_dividing_the_shards_a_keys_partition_is_the_same_for_any_count(
    key, partitions, times
):
    """With P dividing S (powers of two), a key's shard modulo P is its index of P shards:
    an internal partition does not depend on the shard count, so copies in flight survive
    a change of count."""
    shards = partitions * times
    assert shard_index(key, shards) % partitions == shard_index(key, partitions)
    assert shard_index(key, 128) % 32 == shard_index(key, 32)


def test_names_of_other_layouts_or_counts_are_told_apart():
    assert shard_layout("shard-100") is None and shard_layout("x") is None
    assert shard_layout("shard-032-of-032") is None  # index out of the count
    assert shard_layout("shard-7-of-032") is None  # not the name shard_name writes
    assert shard_layout(shard_name(1023, 1024)) == (1023, 1024)
    assert of_layout("shard-003-of-032", 32) and not of_layout("shard-003-of-032", 128)
    assert shard_names(3) == tuple(shard_name(i, 3) for i in range(3))
    assert shard_names(3) is shard_names(3) and shard_names(128)[5] == "shard-005-of-128"


@given(st.text(min_size=1, max_size=20).filter(lambda s: "\x1f" not in s), st.text(max_size=20))
def test_an_instance_key_splits_back_into_its_parts(experiment, unit):
    assert split_key(instance_key(experiment, unit)) == (experiment, unit)
    assert split_key(instance_key(experiment, None)) == (experiment, None)


def test_a_shard_count_below_one_is_refused_by_name():
    with pytest.raises(ValueError, match="shards must be 1 or more, got 0"):
        shard_of("e", 0)
    with pytest.raises(ValueError, match="shards must be 1 or more, got -3"):
        shard_names(-3)


def test_the_modules_examples_hold():
    """pytest's --doctest-modules does not read compiled modules: run the examples here."""
    result = doctest.testmod(keys)
    assert result.attempted > 0 and result.failed == 0
