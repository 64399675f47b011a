"""Shadow groups of transactional virtual commits (proxy/virtual/shadows.py): names on the
group's own ``__consumer_offsets`` partition, their parse, and the shadow commit metadata."""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.protocol.groups import group_partition, java_string_hash
from proxy.virtual import shadows
from proxy.virtual.shadows import (
    SALT_LIMIT,
    Shadow,
    ShadowMetadata,
    ShadowMetadataTooLarge,
    ShadowNameError,
    decode_metadata,
    encode_metadata,
    java_length,
    metadata_room,
    parse_shadow,
    shadow_group,
    shadow_salt,
)


def _by_definition(text: str) -> int:
    """s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, exact, then taken as an int32."""
    units = text.encode("utf-16-be")
    exact = sum(((units[2 * k] << 8) | units[2 * k + 1]) * 31 ** (len(units) // 2 - 1 - k)
                for k in range(len(units) // 2))
    value = exact % (1 << 32)
    return value - (1 << 32) if value >= 1 << 31 else value


def _lowest_salt(group: str, shares: int, share: int, partitions: int) -> int:
    """The design's rule, spelled out with whole-name hashes (no incremental arithmetic)."""
    target = group_partition(group, partitions)
    salt = 0
    while group_partition(f"{group}.kr{shares}/{share}#{salt}", partitions) != target:
        salt += 1
    return salt


# -- Java's String.hashCode ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("", 0),
    ("a", 97),
    ("ab", 97 * 31 + 98),
    ("abc", 96354),
    ("hello", 99162322),
    ("hello world", 1794106052),  # wraps past 2**32
    ("Aa", 2112), ("BB", 2112),  # the classic collision
    ("polygenelubricants", -(1 << 31)),  # Integer.MIN_VALUE
    ("\U0001F600", 0xD83D * 31 + 0xDE00),  # a surrogate pair: two code units
])
def test_java_string_hash_known_values(text, expected):
    assert java_string_hash(text) == expected == _by_definition(text)


@given(st.text(max_size=60))
def test_java_string_hash_matches_the_definition(text):
    assert java_string_hash(text) == _by_definition(text)


def test_group_partition_of_min_value_is_zero():
    # Utils.abs(Integer.MIN_VALUE) is 0, not Math.abs's MIN_VALUE
    assert group_partition("polygenelubricants", 7) == 0
    assert group_partition("hello", 50) == 99162322 % 50
    assert group_partition("hello world", 13) == 1794106052 % 13


# -- names ----------------------------------------------------------------------------------------

_RNG = random.Random(20261125)
_GROUPS = ["orders-app", "streams.app.kr4", "a", "grp/1#2", "Zählgruppe", "\U0001F600-app"] + [
    "".join(_RNG.choice(string.ascii_letters + string.digits + "-_.") for _ in range(_RNG.randint(1, 40)))
    for _ in range(6)]
_REALISTIC = [count for count in range(1, 261) if count % 31] + [500, 1000, 1024]


def test_salt_lands_on_the_group_partition_for_realistic_partition_counts():
    for partitions in _REALISTIC:
        for group in _GROUPS:
            name = shadow_group(group, 4, 3, partitions)
            assert group_partition(name, partitions) == group_partition(group, partitions), (group, partitions)
            assert parse_shadow(name) == Shadow(group, 4, 3, int(name.rpartition("#")[2]))


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 30, 32, 50, 64, 100, 150])
def test_salt_is_the_lowest_that_lands(partitions):
    for group in _GROUPS:
        for shares, share in ((2, 0), (2, 1), (64, 63)):
            salt = shadow_salt(group, shares, share, partitions)
            assert salt == _lowest_salt(group, shares, share, partitions)
            assert shadow_group(group, shares, share, partitions) == f"{group}.kr{shares}/{share}#{salt}"


def test_default_partition_count_needs_small_salts():
    # offsets.topic.num.partitions defaults to 50: salts stay in the low hundreds
    assert max(shadow_salt(group, shares, share, 50)
               for group in _GROUPS for shares in (2, 4, 64) for share in (0, shares - 1)) < 500


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(group=st.text(min_size=1, max_size=30), shares=st.integers(2, 64), data=st.data(),
       partitions=st.sampled_from([1, 3, 10, 16, 50, 64, 100, 150, 200, 256, 1000]))
def test_shadow_names_land_and_round_trip(group, shares, data, partitions):
    share = data.draw(st.integers(0, shares - 1))
    name = shadow_group(group, shares, share, partitions)
    assert group_partition(name, partitions) == group_partition(group, partitions)
    parsed = parse_shadow(name, partitions)
    assert parsed is not None
    assert (parsed.group, parsed.shares, parsed.share) == (group, shares, share)
    assert parsed.name == name
    assert parse_shadow(name) == parsed


def test_multiple_of_31_can_have_no_salt_below_the_limit():
    # Modulo 31 a Java hash is its last code unit less 4 per 2**32 wrap: decimal salts
    # reach few residues, and this group's partition of 31 is not among them below the cap.
    with pytest.raises(ShadowNameError, match=r"no salt below 100000 .* of 31 \(a multiple of 31"):
        shadow_group("payments", 2, 0, 31)
    # other groups are lucky: the rule itself still holds
    assert shadow_salt("billing", 4, 0, 31) == 0 == _lowest_salt("billing", 4, 0, 31)
    assert SALT_LIMIT == 100_000


@pytest.mark.parametrize(("args", "reason"), [
    (("", 4, 0, 50), "non-empty group"),
    (("g", 1, 0, 50), "at least 2"),
    (("g", 4, 4, 50), r"outside 0\.\.3"),
    (("g", 4, -1, 50), r"outside 0\.\.3"),
    (("g", 4, 0, 0), "at least 1"),
])
def test_bad_arguments_are_refused(args, reason):
    with pytest.raises(ShadowNameError, match=reason):
        shadow_group(*args)


def test_a_name_too_long_for_kafka_is_refused():
    with pytest.raises(ShadowNameError, match="32767 bytes"):
        shadow_group("g" * 32760, 4, 0, 1)


@pytest.mark.parametrize("name", [
    "orders", "orders.kr4", "orders.kr4/1", "orders.kr4#0", ".kr4/1#0", "orders.kr4/1#",
    "orders.kr4/#0", "orders.kr/1#0", "orders.kr1/0#0", "orders.kr4/4#0", "orders.kr04/1#0",
    "orders.kr4/01#0", "orders.kr4/1#00", "orders.kr4/1#+1", "orders.kr4/1# 1", "orders.kr4/1#1_0",
    "orders.kr4/1#١", f"orders.kr4/1#{SALT_LIMIT}", "orders.kr4/1#99999999999999999999",
    "orders.kr4/1#0x",
])
def test_names_that_are_not_shadows(name):
    assert parse_shadow(name) is None


def test_parse_reads_from_the_right():
    assert parse_shadow("a.kr2/1#0.kr8/7#12") == Shadow("a.kr2/1#0", 8, 7, 12)
    assert parse_shadow("x#y/z.kr3/2#0") == Shadow("x#y/z", 3, 2, 0)


def test_parse_with_the_partition_count_checks_the_salt():
    name = shadow_group("orders-app", 4, 1, 50)
    shadow = parse_shadow(name, 50)
    assert shadow is not None and shadow.group == "orders-app"
    # same form, another salt: an application's own group, not ours
    other = f"orders-app.kr4/1#{shadow.salt + 1}"
    assert parse_shadow(other) is not None
    assert parse_shadow(other, 50) is None
    # and a name whose group has no salt at all for that count
    assert parse_shadow("payments.kr2/0#5", 31) is None


def test_searches_are_cached():
    shadows._search.cache_clear()
    shadow_group("cached", 4, 0, 50)
    shadow_group("cached", 4, 0, 50)
    assert shadows._search.cache_info().hits == 1


# -- metadata ----------------------------------------------------------------------------------------


def test_metadata_format():
    assert encode_metadata(3, 17, "partition-time=5") == "keyrange.txn/1:3:17:partition-time=5"
    assert encode_metadata(0, 0, None) == "keyrange.txn/1:0:0:"
    assert decode_metadata("keyrange.txn/1:0:0:") == ShadowMetadata(0, 0, "")


@given(epoch=st.integers(0, (1 << 63) - 1), sequence=st.integers(0, (1 << 63) - 1),
       client=st.text(max_size=200))
def test_metadata_round_trips(epoch, sequence, client):
    assert decode_metadata(encode_metadata(epoch, sequence, client)) == ShadowMetadata(epoch, sequence, client)


def test_client_metadata_with_colons_and_our_prefix_round_trips():
    client = "keyrange.txn/1:9:9:x:y"
    assert decode_metadata(encode_metadata(1, 2, client)) == ShadowMetadata(1, 2, client)


def test_metadata_limit_counts_utf16_code_units():
    header = len("keyrange.txn/1:12:345:")
    room = metadata_room(12, 345)
    assert room == 4096 - header
    # CJK: one code unit (three UTF-8 bytes) each; exactly the room fits
    text = encode_metadata(12, 345, "字" * room)
    assert java_length(text) == 4096 and len(text.encode()) > 4096
    with pytest.raises(ShadowMetadataTooLarge, match=r"4097 UTF-16 code units exceeds offset\.metadata\.max\.bytes="
                                                     r"4096: the client's metadata may hold at most"):
        encode_metadata(12, 345, "字" * (room + 1))
    # outside the Basic Multilingual Plane: two code units each, as Java's String.length()
    assert java_length("\U0001F600") == 2
    encode_metadata(12, 345, "\U0001F600" * (room // 2))
    with pytest.raises(ShadowMetadataTooLarge) as refused:
        encode_metadata(12, 345, "\U0001F600" * (room // 2 + 1))
    assert (refused.value.limit, refused.value.room) == (4096, room)


def test_metadata_limit_is_configurable():
    assert encode_metadata(1, 1, "ab", limit=len("keyrange.txn/1:1:1:ab")) == "keyrange.txn/1:1:1:ab"
    with pytest.raises(ShadowMetadataTooLarge):
        encode_metadata(1, 1, "abc", limit=len("keyrange.txn/1:1:1:ab"))
    assert metadata_room(1, 1, limit=5) == 0


@pytest.mark.parametrize(("epoch", "sequence"), [(-1, 0), (0, -1), (1 << 63, 0)])
def test_metadata_numbers_out_of_range_are_refused(epoch, sequence):
    with pytest.raises(ValueError, match="must be in"):
        encode_metadata(epoch, sequence, "")


@pytest.mark.parametrize("metadata", [
    None, "", "client metadata", "keyrange.watermarks/2:0:4/1=5@1", "keyrange.txn/2:1:1:",
    "keyrange.txn/1:", "keyrange.txn/1:1", "keyrange.txn/1:1:", "keyrange.txn/1:1:1",
    "keyrange.txn/1::1:", "keyrange.txn/1:1::", "keyrange.txn/1:-1:1:", "keyrange.txn/1:01:1:",
    "keyrange.txn/1:1:+1:", "keyrange.txn/1:9223372036854775808:1:", "keyrange.txn/1: 1:1:",
])
def test_metadata_that_is_not_ours_reads_as_none(metadata):
    assert decode_metadata(metadata) is None
