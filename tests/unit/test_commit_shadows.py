"""Share shadows of transactional commits of virtual partitions (proxy/commits/shadows.py):
names on the group's own ``__consumer_offsets`` partition, their parse, and the share
shadow commit metadata."""

from __future__ import annotations

import itertools
import random
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.commits.shadows import (
    MAX_SALT_LENGTH,
    SALT_ALPHABET,
    ShadowMetadataTooLarge,
    ShadowNameError,
    ShareMetadata,
    ShareShadow,
    decode_share_metadata,
    encode_share_metadata,
    java_length,
    metadata_room,
    parse_share_shadow,
    share_shadow,
    share_shadow_salt,
)
from proxy.protocol import groups
from proxy.protocol.groups import group_partition, java_string_hash


def _by_definition(text: str) -> int:
    """s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, exact, then taken as an int32."""
    units = text.encode("utf-16-be")
    exact = sum(((units[2 * k] << 8) | units[2 * k + 1]) * 31 ** (len(units) // 2 - 1 - k)
                for k in range(len(units) // 2))
    value = exact % (1 << 32)
    return value - (1 << 32) if value >= 1 << 31 else value


def _salts():
    """Every salt in the design's order: length 1, 2, 3; code-point order, first char major."""
    alphabet = [chr(code) for code in range(ord("0"), ord("o") + 1)]
    for length in (1, 2, 3):
        for chars in itertools.product(alphabet, repeat=length):
            yield "".join(chars)


def _first_salt(group: str, shares: int, share: int, partitions: int) -> str | None:
    """The design's rule, spelled out with whole-name hashes (no incremental arithmetic)."""
    target = group_partition(group, partitions)
    return next((salt for salt in _salts() if group_partition(f"{group}.kr{shares}/{share}#{salt}", partitions)
                 == target), None)


def _partition_of_unsigned(value: int, partitions: int) -> int:
    """Utils.abs of ``value`` taken as an int32, modulo ``partitions``, by the definition."""
    signed = value % (1 << 32)
    signed = signed - (1 << 32) if signed >= 1 << 31 else signed
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


def _first_salt_after(base: int, target: int, partitions: int, longest: int = 3) -> str | None:
    """The rule from the unsigned hash ``base`` of what precedes the salt: the first salt s
    with ``Utils.abs(base * 31**len(s) + h(s)) % partitions == target``."""
    return next((salt for salt in _salts() if len(salt) <= longest and _partition_of_unsigned(
        base * 31 ** len(salt) + java_string_hash(salt), partitions) == target), None)


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
# 20 varied ids: ASCII, a shadow's own form, CJK, astral (surrogate pairs), U+FFFF, long ones
_SAMPLE = _GROUPS + ["payments", "billing", "注文処理グループ", "\U0001D50A\U0001D52F\U0001D52C-\U0001F680",
                     "orders.kr4/1#0", "\uffff\u0080", "Ω" * 50, "x" * 200]
_MULTIPLES_OF_31 = [31, 62, 93, 124, 155, 186, 217, 248, 310, 620, 992, 1085]


def test_the_alphabet():
    assert SALT_ALPHABET == "".join(chr(code) for code in range(0x30, 0x70))
    assert (SALT_ALPHABET[0], SALT_ALPHABET[-1], len(SALT_ALPHABET), MAX_SALT_LENGTH) == ("0", "o", 64, 3)
    assert "#" not in SALT_ALPHABET and "/" not in SALT_ALPHABET


def test_every_count_up_to_1100_needs_at_most_two_characters():
    # two characters of 64 consecutive code points: 2017 consecutive hashes, every residue
    # (multiples of 31 included, which decimal salts could not reach)
    assert len(_SAMPLE) == 20 and set(_MULTIPLES_OF_31) < set(range(1, 1101))
    worst = 0
    for partitions in range(1, 1101):
        for group in _SAMPLE:
            salt = share_shadow_salt(group, 4, 3, partitions)
            assert 1 <= len(salt) <= 2 and set(salt) <= set(SALT_ALPHABET), (group, partitions, salt)
            worst = max(worst, len(salt))
    assert worst == 2


def test_salt_lands_on_the_group_partition():
    for partitions in [*range(1, 261), 500, 992, 1000, 1024, 1100, 5000]:
        for group in _SAMPLE:
            name = share_shadow(group, 4, 3, partitions)
            assert group_partition(name, partitions) == group_partition(group, partitions), (group, partitions)
            assert parse_share_shadow(name) == ShareShadow(group, 4, 3, name.rpartition("#")[2])
            assert parse_share_shadow(name, partitions) == parse_share_shadow(name)


@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 30, 31, 32, 50, 62, 64, 93, 100, 150, 310, 992, 1024])
def test_salt_is_the_first_that_lands(partitions):
    for group in _SAMPLE if partitions <= 100 else _GROUPS[:6]:
        for shares, share in ((2, 0), (2, 1), (64, 63)):
            salt = share_shadow_salt(group, shares, share, partitions)
            assert salt == _first_salt(group, shares, share, partitions)
            assert share_shadow(group, shares, share, partitions) == f"{group}.kr{shares}/{share}#{salt}"


def test_large_counts_use_three_characters():
    lengths = set()
    for group in _GROUPS[:6]:
        salt = share_shadow_salt(group, 4, 0, 5000)
        base = java_string_hash(f"{group}.kr4/0#") & 0xFFFFFFFF
        assert salt == _first_salt_after(base, group_partition(group, 5000), 5000)
        lengths.add(len(salt))
    assert 3 in lengths


_INVERSE_961 = pow(31 ** 2, -1, 1 << 32)


@pytest.mark.parametrize("boundary", [1 << 31, 0])
def test_blocks_across_a_sign_change(boundary):
    # bases whose two-character hashes (base * 961 + 1536..3552) straddle MIN_VALUE or 0,
    # where Utils.abs stops being monotonic: still the first salt in order, and two
    # characters still reach every count up to 1008
    rng = random.Random(boundary)
    for offset in [1536, 1537, 1600, 2544, 2545, 3551, 3552, *rng.sample(range(1536, 3553), 8)]:
        base = ((boundary - offset) * _INVERSE_961) % (1 << 32)
        for partitions in (7, 31, 50, 500, 1008):
            for target in {0, partitions - 1, *rng.sample(range(partitions), min(partitions, 6))}:
                salt = groups.first_salt(base, target, partitions)
                assert salt is not None and len(salt) <= 2, (offset, partitions, target)
                assert salt == _first_salt_after(base, target, partitions, longest=2)


def test_a_sign_change_can_push_1009_partitions_to_three_characters():
    # the 2017 hashes split around MIN_VALUE into two runs of 1008 absolute values: one
    # residue modulo 1009 is missing; the third character is found in order
    base = (((1 << 31) - 2544) * _INVERSE_961) % (1 << 32)
    missing = [target for target in range(1009) if len(groups.first_salt(base, target, 1009) or "") > 2]
    assert len(missing) == 1
    salt = groups.first_salt(base, missing[0], 1009)
    assert salt is not None and len(salt) == 3 and salt == _first_salt_after(base, missing[0], 1009)


def test_default_partition_count_needs_short_salts():
    # offsets.topic.num.partitions defaults to 50: one character for most names, never more than two
    lengths = [len(share_shadow_salt(group, shares, share, 50))
               for group in _SAMPLE for shares in (2, 4, 64) for share in (0, shares - 1)]
    assert max(lengths) <= 2 and lengths.count(1) > len(lengths) // 2


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(group=st.text(min_size=1, max_size=30), shares=st.integers(2, 64), data=st.data(),
       partitions=st.sampled_from([1, 3, 10, 16, 31, 50, 62, 64, 100, 150, 200, 256, 310, 992, 1000]))
def test_shadow_names_land_and_round_trip(group, shares, data, partitions):
    share = data.draw(st.integers(0, shares - 1))
    name = share_shadow(group, shares, share, partitions)
    assert group_partition(name, partitions) == group_partition(group, partitions)
    parsed = parse_share_shadow(name, partitions)
    assert parsed is not None
    assert (parsed.group, parsed.shares, parsed.share) == (group, shares, share)
    assert parsed.name == name
    assert parse_share_shadow(name) == parsed


def test_no_salt_beyond_three_characters():
    # 66 784 salts cannot reach every residue of a billion partitions; never a fourth character
    with pytest.raises(ShadowNameError, match=r"no salt of at most 3 characters .* of 1000000000$"):
        share_shadow("payments", 2, 0, 1_000_000_000)


@pytest.mark.parametrize(("args", "reason"), [
    (("", 4, 0, 50), "non-empty group"),
    (("g", 1, 0, 50), "at least 2"),
    (("g", 4, 4, 50), r"outside 0\.\.3"),
    (("g", 4, -1, 50), r"outside 0\.\.3"),
    (("g", 4, 0, 0), "at least 1"),
])
def test_bad_arguments_are_refused(args, reason):
    with pytest.raises(ShadowNameError, match=reason):
        share_shadow(*args)


def test_a_name_too_long_for_kafka_is_refused():
    with pytest.raises(ShadowNameError, match="32767 bytes"):
        share_shadow("g" * 32760, 4, 0, 1)


@pytest.mark.parametrize("name", [
    "orders", "orders.kr4", "orders.kr4/1", "orders.kr4#0", ".kr4/1#0", "orders.kr4/1#",
    "orders.kr4/#0", "orders.kr/1#0", "orders.kr1/0#0", "orders.kr4/4#0", "orders.kr04/1#0",
    "orders.kr4/01#0", "orders.kr4/+1#0", "orders.kr4/1#0000", "orders.kr4/1#99999", "orders.kr4/1#+1",
    "orders.kr4/1# 1", "orders.kr4/1#1-0", "orders.kr4/1#١", "orders.kr4/1#p", "orders.kr4/1#0p",
    "orders.kr4/1#/", "orders.kr4/1#.", "orders.kr4/1#ö", "orders.kr4/1#Ａ", "orders.kr4/1#\U0001F600",
    "orders.kr4/1#0x\n", "orders.kr4/1#0x1",
])
def test_names_that_are_not_shadows(name):
    assert parse_share_shadow(name) is None


@pytest.mark.parametrize("salt", ["0", "o", "A", "_", "`", "\\", "@?", "00", "0o", "o0", "oo", "1_0", "a[;", "ooo", "000"])
def test_every_salt_of_the_alphabet_up_to_three_characters_parses(salt):
    assert parse_share_shadow(f"orders.kr4/1#{salt}") == ShareShadow("orders", 4, 1, salt)


def test_parse_reads_from_the_right():
    assert parse_share_shadow("a.kr2/1#0.kr8/7#12") == ShareShadow("a.kr2/1#0", 8, 7, "12")
    assert parse_share_shadow("x#y/z.kr3/2#0") == ShareShadow("x#y/z", 3, 2, "0")
    assert parse_share_shadow("a.kr2/1#0.kr8/7#1.2") is None  # '.' is no salt character


def test_parse_with_the_partition_count_checks_the_salt():
    name = share_shadow("orders-app", 4, 1, 50)
    shadow = parse_share_shadow(name, 50)
    assert shadow is not None and shadow.group == "orders-app"
    assert parse_share_shadow(name, 50) == ShareShadow("orders-app", 4, 1, share_shadow_salt("orders-app", 4, 1, 50))
    # same form, another salt: an application's own group, not ours
    for salt in ("o", "oo", "ooo", shadow.salt + "0"):
        if salt == shadow.salt:
            continue
        other = f"orders-app.kr4/1#{salt}"
        assert parse_share_shadow(other) == ShareShadow("orders-app", 4, 1, salt)
        assert parse_share_shadow(other, 50) is None
    # a multiple of 31: every group has its salt now
    for group in _SAMPLE:
        name = share_shadow(group, 2, 0, 31)
        assert parse_share_shadow(name, 31) == ShareShadow(group, 2, 0, name.rpartition("#")[2])
    # and a name whose group has no salt at all for that count
    assert parse_share_shadow("payments.kr2/0#5", 1_000_000_000) is None


def test_searches_are_cached():
    groups.salt_for.cache_clear()
    share_shadow("cached", 4, 0, 50)
    share_shadow("cached", 4, 0, 50)
    assert groups.salt_for.cache_info().hits == 1


# -- metadata ----------------------------------------------------------------------------------------


def test_metadata_format():
    assert encode_share_metadata(3, 17, "partition-time=5") == "keyrange.txn/1:3:17:partition-time=5"
    assert encode_share_metadata(0, 0, None) == "keyrange.txn/1:0:0:"
    assert decode_share_metadata("keyrange.txn/1:0:0:") == ShareMetadata(0, 0, "")


@given(epoch=st.integers(0, (1 << 63) - 1), sequence=st.integers(0, (1 << 63) - 1),
       client=st.text(max_size=200))
def test_metadata_round_trips(epoch, sequence, client):
    assert decode_share_metadata(encode_share_metadata(epoch, sequence, client)) == ShareMetadata(epoch, sequence, client)


def test_client_metadata_with_colons_and_our_prefix_round_trips():
    client = "keyrange.txn/1:9:9:x:y"
    assert decode_share_metadata(encode_share_metadata(1, 2, client)) == ShareMetadata(1, 2, client)


def test_metadata_limit_counts_utf16_code_units():
    header = len("keyrange.txn/1:12:345:")
    room = metadata_room(12, 345)
    assert room == 4096 - header
    # CJK: one code unit (three UTF-8 bytes) each; exactly the room fits
    text = encode_share_metadata(12, 345, "字" * room)
    assert java_length(text) == 4096 and len(text.encode()) > 4096
    with pytest.raises(ShadowMetadataTooLarge, match=r"4097 UTF-16 code units exceeds offset\.metadata\.max\.bytes="
                                                     r"4096: the client's metadata may hold at most"):
        encode_share_metadata(12, 345, "字" * (room + 1))
    # outside the Basic Multilingual Plane: two code units each, as Java's String.length()
    assert java_length("\U0001F600") == 2
    encode_share_metadata(12, 345, "\U0001F600" * (room // 2))
    with pytest.raises(ShadowMetadataTooLarge) as refused:
        encode_share_metadata(12, 345, "\U0001F600" * (room // 2 + 1))
    assert (refused.value.limit, refused.value.room) == (4096, room)


def test_metadata_limit_is_configurable():
    assert encode_share_metadata(1, 1, "ab", limit=len("keyrange.txn/1:1:1:ab")) == "keyrange.txn/1:1:1:ab"
    with pytest.raises(ShadowMetadataTooLarge):
        encode_share_metadata(1, 1, "abc", limit=len("keyrange.txn/1:1:1:ab"))
    assert metadata_room(1, 1, limit=5) == 0


@pytest.mark.parametrize(("epoch", "sequence"), [(-1, 0), (0, -1), (1 << 63, 0)])
def test_metadata_numbers_out_of_range_are_refused(epoch, sequence):
    with pytest.raises(ValueError, match="must be in"):
        encode_share_metadata(epoch, sequence, "")


@pytest.mark.parametrize("metadata", [
    None, "", "client metadata", "keyrange.watermarks/2:0:4/1=5@1", "keyrange.txn/2:1:1:",
    "keyrange.txn/1:", "keyrange.txn/1:1", "keyrange.txn/1:1:", "keyrange.txn/1:1:1",
    "keyrange.txn/1::1:", "keyrange.txn/1:1::", "keyrange.txn/1:-1:1:", "keyrange.txn/1:01:1:",
    "keyrange.txn/1:1:+1:", "keyrange.txn/1:9223372036854775808:1:", "keyrange.txn/1: 1:1:",
])
def test_metadata_that_is_not_ours_reads_as_none(metadata):
    assert decode_share_metadata(metadata) is None
