"""Where Kafka places a consumer group: its ``__consumer_offsets`` partition, without I/O.

The group coordinator of group G is the leader of partition
``Utils.abs(G.hashCode()) % offsets.topic.num.partitions`` of ``__consumer_offsets``, so
that partition holds G's offsets, its transactional offset commits and, beside them, the
individual-commit log's records of G. Both the commit log and the shadow groups of
transactional commits (``proxy.commits.shadows``) need this arithmetic, and it is a fact of
the Kafka protocol rather than of either, hence this layer.
"""

from __future__ import annotations

import functools
import itertools

__all__ = ["MAX_SALT_LENGTH", "SALT_ALPHABET", "first_salt", "group_partition", "is_salt", "java_string_hash",
           "parse_salted", "salt_for", "salted_group"]

# Salts of group names the proxy keeps beside a group (transactional commits' shadow
# groups): one to three characters from 64 consecutive code points, '0' (U+0030) through
# 'o' (U+006F). Neither '#' nor '/' is among them, so a name reads back from the right.
_FIRST = 0x30
_SIZE = 64
SALT_ALPHABET = "".join(map(chr, range(_FIRST, _FIRST + _SIZE)))
# Three characters reach every partition count up to 31 280 (proxy.commits.shadows says why).
MAX_SALT_LENGTH = 3
_MASK = 0xFFFFFFFF


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, 32-bit signed arithmetic."""
    value = 0
    data = text.encode("utf-16-be", "surrogatepass")
    for index in range(0, len(data), 2):
        value = (31 * value + ((data[index] << 8) | data[index + 1])) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


@functools.lru_cache(maxsize=4096)
def group_partition(group: str, partitions: int) -> int:
    """``Utils.abs(group.hashCode()) % partitions``; Utils.abs(Integer.MIN_VALUE) is 0.
    Remembered for the groups seen last: the commit and grants logs ask it on every request
    of a group (a Python loop over the name's characters)."""
    value = java_string_hash(group)
    value = 0 if value == -(1 << 31) else abs(value)
    return value % partitions


def _partition_of(value: int, partitions: int) -> int:
    """``Utils.abs(value as int32) % partitions``; Utils.abs(MIN_VALUE) is 0."""
    value &= _MASK
    if value >= 1 << 31:
        value = (1 << 32) - value  # abs of the signed value; MIN_VALUE stays 2**31
    return value % (1 << 31) % partitions


def _first_step(start: int, target: int, partitions: int) -> int | None:
    """The lowest j below 64 whose unsigned hash ``start + j`` (mod 2**32) lands on
    ``target``; None when none does."""
    last = start + _SIZE - 1
    if last < 1 << 31:  # all non-negative as int32: abs is the value, rising with j
        step = (target - start) % partitions
    elif start > 1 << 31 and last < 1 << 32:  # all negative above MIN_VALUE: abs falls with j
        step = ((1 << 32) - start - target) % partitions
    else:  # the block straddles MIN_VALUE or 0: one at a time
        return next((j for j in range(_SIZE) if _partition_of(start + j, partitions) == target), None)
    return step if step < _SIZE else None


@functools.lru_cache(maxsize=4096)
def salt_for(prefix: str, target: int, partitions: int) -> str | None:
    """The first salt s (shortest first, then in code-point order, the first character
    major) that puts ``prefix + "#" + s`` on partition ``target`` of ``partitions``; None
    when no salt of at most ``MAX_SALT_LENGTH`` characters does. Cached per name.

    h(prefix + "#" + s) = h(prefix + "#") * 31**len(s) + h(s) mod 2**32, so the prefix is
    hashed once (``first_salt`` does the rest)."""
    return first_salt(java_string_hash(prefix + "#") & _MASK, target, partitions)


def first_salt(base: int, target: int, partitions: int) -> str | None:
    """``salt_for`` from ``base``, the unsigned hash of what precedes the salt. Salts that
    differ in their last character only are consecutive in order and in hash (h(head + c)
    = h(head) * 31 + c), so each block of 64 is settled by one modular step, unless it
    straddles a sign change of the int32."""
    for length in range(1, MAX_SALT_LENGTH + 1):
        scaled = base * pow(31, length, 1 << 32)
        for head in itertools.product(SALT_ALPHABET, repeat=length - 1):
            text = "".join(head)
            start = (scaled + java_string_hash(text) * 31 + _FIRST) & _MASK
            step = _first_step(start, target, partitions)
            if step is not None:
                return text + SALT_ALPHABET[step]
    return None


def is_salt(text: str) -> bool:
    """Whether ``text`` is a salt ``salt_for`` can write."""
    return 1 <= len(text) <= MAX_SALT_LENGTH and all(_FIRST <= ord(char) < _FIRST + _SIZE for char in text)


def salted_group(prefix: str, group: str, partitions: int) -> str:
    """``prefix#salt`` on ``group``'s ``__consumer_offsets`` partition (ValueError when no
    salt reaches it)."""
    salt = salt_for(prefix, group_partition(group, partitions), partitions)
    if salt is None:
        raise ValueError(f"no salt of at most {MAX_SALT_LENGTH} characters puts {prefix!r} on the "
                         f"__consumer_offsets partition of {group!r} ({partitions} partitions)")
    return f"{prefix}#{salt}"


def parse_salted(name: str, group: str, partitions: int) -> str | None:
    """The prefix of ``name`` when it is exactly what ``salted_group(prefix, group,
    partitions)`` writes, else None."""
    prefix, mark, salt = name.rpartition("#")
    if not mark or not is_salt(salt):
        return None
    if salt_for(prefix, group_partition(group, partitions), partitions) != salt:
        return None
    return prefix

