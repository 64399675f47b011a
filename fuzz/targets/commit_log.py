"""Records of ``__individual_commit_offsets`` as the proxy reads them back, and the packed
offset-range kernels those records and range commits go through.

Any client with produce rights can write that topic, and a record may come from a newer
or older proxy, so the reader must take anything: ``StateTable.apply`` is the entry point
of every log read and promises to skip an unreadable record (it catches the decoders'
``ProtocolError`` and ``ValueError``) rather than stop reading the partition. Behind it,
``decode_key`` and ``decode_value`` (a hand-written fast path for the versions this proxy
writes, the schema codec for the rest) must agree with the writers: a key decodes to what
re-encodes to its bytes, and a value's state written again reads back equal.

The packed kernels have a C implementation and a Python reference with identical results;
both run and are compared, on the inputs production gives them: arbitrary bytes for
``sort_checked`` and ``from_deltas`` (a client's ranges, a log value), valid states and
checked commits for ``merge``, ``stable_after`` and ``to_deltas``.

Share watermarks of virtual range topics also come back from Kafka in a second form: the
metadata string of the coordinator's committed offset, which any group member can set.
``decode_metadata`` promises None for anything that is not ours, and ``combine`` (the
state OffsetFetch of a virtual partition answers) and ``per_share`` run on what it
returns; neither may fail, and the floor they move S to is the one
``watermark_floor`` documents: only a K whose every share has a watermark counts.

Input: a mode byte. Mode 0: uint16 key length, key, then the value (none if empty: a
tombstone). Mode 1: int64 stable offset, uint16 length, then two byte strings for the
kernels. Mode 2: int64 committed offset, then the metadata string.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from fuzz.common import Choices, InvariantBroken, generated_functions
from proxy.commits import _packed_py
from proxy.commits.codec import decode_key, decode_value, encode_key, encode_value, encode_value_generic
from proxy.commits.packed import MAX_OFFSET
from proxy.commits.state import CommitState, Marks, watermark_floor
from proxy.commits.table import StateTable
from proxy.commits.watermarks import combine, decode_metadata, per_share
from proxy.protocol import messages
from proxy.protocol.compiler import compile_message
from proxy.protocol.errors import ProtocolError
from proxy.protocol.schema import registry

IMPLEMENTATIONS: list[ModuleType] = [_packed_py]
try:
    IMPLEMENTATIONS.append(importlib.import_module("proxy.commits._cpacked"))
except ImportError:  # not built: the reference runs alone
    pass
MAX_ENTRIES_BASE = 1024
MAX_ENTRIES_PER_BYTE = 8


def generated_code() -> list:
    """The log key and value codecs are generated at run time; the runner instruments them."""
    codecs = []
    for name in ("IndividualCommitKey", "IndividualCommitValue"):
        versions = registry().by_name[name].valid_versions
        codecs += [compile_message("ours", name, version) for version in range(versions.lo, versions.hi + 1)]
    return generated_functions(codecs)


def _check_key(key: bytes) -> None:
    try:
        group, topic, partition = decode_key(key)
    except ProtocolError:
        return
    if messages.data_version(key) == 0 and encode_key(group, topic, partition) != key:
        raise InvariantBroken("an IndividualCommitKey v0 does not encode back to its bytes")


def _documented_floor(marks: Marks) -> int:
    """``watermark_floor`` as its docstring states it, from the set of shares of each K."""
    shares_of: dict[int, set[int]] = {}
    lowest: dict[int, int] = {}
    for shares, share, offset, _sequence in marks:
        shares_of.setdefault(shares, set()).add(share)
        lowest[shares] = min(offset, lowest.get(shares, offset))
    full = [lowest[k] for k, seen in shares_of.items() if len(seen) == k]
    return max(full, default=-1)


def _check_marks(state: CommitState, source_bytes: int) -> None:
    """``source_bytes``: the size of what the marks were read from. ``per_share`` builds a
    list of K entries per K; a reader must not let a few bytes claim gigabytes, so the
    entries are held to a constant factor of the input (with room for every K up to a
    thousand or so shares, far beyond ``virtual.topic.max.shares``' default of 64)."""
    if watermark_floor(state.marks) != _documented_floor(state.marks):
        raise InvariantBroken(f"watermark_floor of {state.marks!r:.200} counts a K not every share of which "
                              "has a watermark")
    entries = sum({shares for shares, _, _, _ in state.marks})
    if entries > MAX_ENTRIES_BASE + MAX_ENTRIES_PER_BYTE * source_bytes:
        raise InvariantBroken(f"per_share would allocate {entries} entries for watermarks read from "
                              f"{source_bytes} bytes: {state.marks!r:.200}")
    per_share(state.marks)


def _check_value(value: bytes) -> None:
    try:
        state = decode_value(value)
    except (ProtocolError, ValueError):
        return
    _check_marks(state, len(value))
    version = messages.data_version(value)
    if version < 1:
        return  # v0 states are read as written by old releases, never written again
    if state.marks:
        again = encode_value_generic(state, 2)
    else:
        again = encode_value(state)
        if again != encode_value_generic(state, 1):
            raise InvariantBroken("the fast value encoder and the schema codec disagree")
    try:
        read_back = decode_value(again)
    except (ProtocolError, ValueError) as exc:
        raise InvariantBroken(f"a state read from the log cannot be read back once written: {exc}") from exc
    if read_back != state:
        raise InvariantBroken(f"a state read from the log reads back as {read_back!r}, not {state!r}")


def _records(choices: Choices) -> None:
    length = choices.uint(2)
    rest = choices.rest()
    key, value = rest[:length], rest[length:] or None
    _check_key(key)
    if value is not None:
        _check_value(value)
    table = StateTable()
    table.apply(10, key, value)
    table.apply(11, key, value)  # the same key again: states of one epoch join
    table.apply(5, key, None)  # an older tombstone changes nothing
    table.apply(12, key, None)


def _metadata(choices: Choices) -> None:
    committed = choices.uint(8) - (1 << 63)
    metadata = choices.rest().decode("utf-8", "replace")
    decoded = decode_metadata(metadata)
    if decoded is not None:
        _check_marks(CommitState(0, (), decoded[0] or 0, decoded[1]), len(metadata))
    for logged in (None, CommitState(5, [(7, 9)], 0, ((2, 0, 3, 1),))):
        _check_marks(combine(logged, committed, metadata), len(metadata))


def _compare(name: str, run: Callable[[ModuleType], Any]) -> Any:
    results = []
    for impl in IMPLEMENTATIONS:
        try:
            results.append(run(impl))
        except (ValueError, OverflowError) as exc:
            results.append(type(exc).__name__)
    for other in results[1:]:
        if other != results[0]:
            raise InvariantBroken(f"{name}: the Python kernel gives {results[0]!r:.300}, the C kernel {other!r:.300}")
    return results[0]


def _kernels(choices: Choices) -> None:
    stable = choices.uint(8) & MAX_OFFSET
    if choices.byte() & 1:
        stable %= 1 << 20  # near the offsets of the ranges, where the merge does its work
    length = choices.uint(2)
    rest = choices.rest()
    first, second = bytearray(rest[:length]), rest[length:]
    # Packed ranges end each 17-byte element with an empty tagged-field section (a zero
    # byte): wire.py only ever hands the kernels that, so the fuzzer does too.
    first[16::17] = bytes(len(first) // 17)
    checked = _compare("sort_checked", lambda impl: impl.sort_checked(bytes(first)))
    held = _compare("from_deltas", lambda impl: impl.from_deltas(stable, second))
    if isinstance(held, bytes):
        # A state read from the log is valid, so it can be written again, and reads back.
        again = _compare("to_deltas", lambda impl: impl.to_deltas(stable, held))
        if not isinstance(again, bytes):
            raise InvariantBroken(f"ranges from_deltas accepted cannot be written back: {again}")
        if _compare("from_deltas", lambda impl: impl.from_deltas(stable, again)) != held:
            raise InvariantBroken("to_deltas wrote deltas that do not read back as the same ranges")
    if isinstance(checked, tuple) and checked[0] is None and isinstance(held, bytes):
        commit = checked[1]
        merged = _compare("merge", lambda impl: impl.merge(stable, held, commit))
        after = _compare("stable_after", lambda impl: impl.stable_after(stable, held, commit))
        if not isinstance(merged, tuple) or merged[0] != after:
            raise InvariantBroken(f"merge gives {merged!r:.200}, stable_after {after!r}")
        written = _compare("to_deltas", lambda impl: impl.to_deltas(merged[0], merged[1]))
        if not isinstance(written, bytes):
            raise InvariantBroken(f"a merged state cannot be written to the log: {written}")


def one_input(data: bytes) -> None:
    choices = Choices(data)
    mode = choices.byte() % 3
    if mode == 0:
        _records(choices)
    elif mode == 1:
        _kernels(choices)
    else:
        _metadata(choices)
