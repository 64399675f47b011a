"""The multi-instance write protocol of one OffsetCommit with ranges, as a state machine
without I/O (docs/individual-commit.md, "Write order", explains why this order).

``RangeCommit`` takes events (what this instance holds of the log, the coordinator's
answers, where a write landed, what another instance wrote) and answers each with the
next action for the I/O edge (``proxy.commits.writes``) to perform:

    begin ──> FetchCommitted ──> Forward                 (request hook, under the key locks)
          └─────────────────────> Forward
    on_response ──> ReadLogEnd ──> [Correct] ──> Write    (response transform)
                └──────────────────────────────> Write
                └──> Answer                               (nothing accepted to write)
    Write ──> Answer                                      (landed where the read ended)
          └─> ReadWindow ──> [Correct] ──> Write ──> ...  (another instance wrote in between;
                         └─> Answer                        at most ``rounds`` windows)

A range commit that would leave a key holding more ranges above S than ``max_held``
(``max.individual.commit.ranges.held``) and more than it holds now is refused before
anything is forwarded (``Forward.refused``, INVALID_COMMIT_OFFSET_SIZE; the reasons are
``over_bound``): the state stored is untouched. The bound is checked against the state
this instance holds; another instance's concurrent commit joined in later may take the
stored state past it by what that commit added, and nothing acknowledged is dropped for it.

Any failure to read or write the log answers the keys it concerns with
COORDINATOR_NOT_AVAILABLE (retriable: merging is idempotent); a correction the
coordinator refuses answers the key with the coordinator's error. Keys are (topic,
partition) of one group; a commit's ranges are packed (``proxy.commits.packed``). A key's
commit may instead be share watermarks of a virtual topic (``MarkEdit``): the protocol is
the same, only the change applied to the state differs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from proxy.commits.codec import encode_value
from proxy.commits.packed import RANGE_SIZE
from proxy.commits.state import (
    CommitState,
    Edit,
    Floor,
    apply_edit,
    apply_packed,
    apply_plain,
    check_held,
    rebase_commit,
    stable_after,
)
from proxy.protocol.constants import ErrorCode

TopicPartitionKey = tuple[str, int]
AppliedState = tuple[int, CommitState]  # (log offset of the newest record of a key, its state)

RECONCILE_ROUNDS = 8  # windows read after a write that did not land where the read ended

_UNAVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE
_OVER_BOUND = ErrorCode.INVALID_COMMIT_OFFSET_SIZE


# -- actions ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FetchCommitted:
    """Ask the coordinator for the committed offsets of ``keys`` (no state yet: S starts
    there); answer with ``on_committed``."""

    keys: tuple[TopicPartitionKey, ...]


@dataclass(frozen=True)
class Forward:
    """Forward the client's OffsetCommit with ``CommittedOffset = offsets[key]`` (S') for
    each range-committed key, and without the keys of ``refused`` (answered with that
    error by the proxy); answer with ``on_response`` once the broker has answered."""

    offsets: dict[TopicPartitionKey, int]
    refused: dict[TopicPartitionKey, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadLogEnd:
    """The read of the log partition's end that started alongside the broker's commit must
    finish now; answer with ``on_log_end`` or ``on_log_end_failed``."""


@dataclass(frozen=True)
class Correct:
    """Commit ``offsets`` to the coordinator from the proxy's own connection, with the
    client's generation, member and instance id; answer with ``on_corrected`` or
    ``on_correction_failed``."""

    offsets: dict[TopicPartitionKey, int]


@dataclass(frozen=True)
class Write:
    """Write ``states`` to the log with acks=all (``encoded``: values already encoded, for a
    key whose state is that very object); answer with ``on_written`` or
    ``on_write_failed``."""

    states: dict[TopicPartitionKey, CommitState]
    encoded: dict[TopicPartitionKey, tuple[CommitState, bytes]] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadWindow:
    """Read the newest record of each of ``keys`` at log offsets [start, stop) (``stop``
    None: to the log's end) from the log itself; answer with ``on_window`` or
    ``on_write_failed``."""

    start: int
    stop: int | None
    keys: frozenset[TopicPartitionKey]


@dataclass(frozen=True)
class Answer:
    """Answer the client: ``errors`` replace the broker's error of those keys, ``stable``
    is the StableOffset of each acknowledged range commit. The end."""

    errors: dict[TopicPartitionKey, int]
    stable: dict[TopicPartitionKey, int]


class _Phase(enum.Enum):
    PLANNING = "planning"
    FORWARDED = "forwarded"
    END_READ = "end read"
    CORRECTING = "correcting"
    WRITING = "writing"
    WINDOW = "window"
    REWRITING = "rewriting"
    DONE = "done"


class ProtocolViolation(RuntimeError):
    """An event that the machine's current phase does not expect (a bug in the edge)."""


class RangeCommit:
    """One OffsetCommit's partitions of one group that change state: ``commits`` (key ->
    the commit's ranges, packed and sorted, or share watermarks; a key listed twice has
    two) and ``plain``
    (key -> offset of a plain commit, which resets a key that has state).

    ``max_held``: the most ranges above S a commit may leave a key holding (None: no
    bound; commits already acknowledged elsewhere, such as committed transactions' stages,
    are folded without one).

    ``coordinator``: whether S' of the commit is the coordinator's to hold (forwarded in
    the client's commit, corrected after a merge that moves it). False for a lift of the
    log to what the coordinator already holds (``Floor`` edits): nothing is forwarded, and
    a merge corrects nothing.

    Attributes the edge reads: ``foreign_writes`` (keys found written by another instance
    since this one read them), ``over_bound`` (key -> why its commit was refused for the
    bound), ``phase``."""

    def __init__(self, commits: dict[TopicPartitionKey, list[Edit]], plain: dict[TopicPartitionKey, int] | None = None, *,
                 rounds: int = RECONCILE_ROUNDS, max_held: int | None = None, coordinator: bool = True) -> None:
        self.commits = commits
        self.plain = plain or {}
        self.rounds = rounds
        self.max_held = max_held
        self.coordinator = coordinator
        self.foreign_writes = 0
        self.over_bound: dict[TopicPartitionKey, str] = {}
        self.phase = _Phase.PLANNING
        self._new: dict[TopicPartitionKey, CommitState] = {}  # the state each key is to have
        self._stable: dict[TopicPartitionKey, int] = {}  # S the coordinator holds for each range commit
        self._pending: dict[TopicPartitionKey, tuple[CommitState, bytes]] = {}  # R' still to compute (``prepare``)
        self._encoded: dict[TopicPartitionKey, tuple[CommitState, bytes]] = {}
        self._basis: dict[TopicPartitionKey, int] = {}  # log offset of the record each state was computed from (-1: none)
        self._accepted: dict[TopicPartitionKey, CommitState] = {}
        self._errors: dict[TopicPartitionKey, int] = {}
        self._end_read = False
        self._read = 0  # every record below it is held in the states
        # One correction or reconcile round in flight:
        self._redo: dict[TopicPartitionKey, CommitState] = {}
        self._corrections: dict[TopicPartitionKey, int] = {}
        self._written = False  # whether the states went to the log already
        self._rounds_done = 0
        self._start = 0  # where the next window starts
        self._at = -1  # where the last write landed (-1: unknown)
        self._count = 0  # records of that write
        self._read_to = 0
        self._merged: dict[TopicPartitionKey, int] = {}

    def _expect(self, *phases: _Phase) -> None:
        if self.phase not in phases:
            raise ProtocolViolation(f"range commit is {self.phase.value}, not {' or '.join(p.value for p in phases)}")

    # -- request hook ---------------------------------------------------------------------------
    def begin(self, position: int, records: dict[TopicPartitionKey, AppliedState], *, end_read: bool) -> FetchCommitted | Forward:
        """This instance holds ``records`` of the group, every record below log offset
        ``position`` among them; ``end_read``: a read of the log's end runs alongside (else
        the log was just read to its end)."""
        self._expect(_Phase.PLANNING)
        self._read = position
        self._end_read = end_read
        missing = tuple(key for key in self.commits if key not in records)
        if missing:
            return FetchCommitted(missing)
        return self.on_committed({}, records)

    def on_committed(self, coordinator: dict[TopicPartitionKey, int | CommitState], records: dict[TopicPartitionKey, AppliedState]) -> Forward:
        """The coordinator's committed offsets (-1: none) of keys without state, or the
        state its committed offset carries (share watermarks in its metadata), and what
        this instance holds now. Computes S' (and R' where a key has several commits; one
        range commit's R' waits for ``prepare``, unless it may pass ``max_held``). A key
        whose commit would pass the bound is refused and left out."""
        self._expect(_Phase.PLANNING)
        bound = self.max_held
        for key, commits in self.commits.items():
            record = records.get(key)
            if record is not None:
                state = record[1]
            else:
                known = coordinator.get(key, -1)
                state = known if isinstance(known, CommitState) else CommitState(max(known, 0))
            if len(commits) == 1 and isinstance(commits[0], bytes):
                # Each committed range adds at most one to R: below the bound that way, R'
                # can wait for ``prepare`` (computed while the broker works).
                if bound is None or state.held() + len(commits[0]) // RANGE_SIZE <= bound:
                    self._basis[key] = record[0] if record is not None else -1
                    self._stable[key] = stable_after(state, commits[0])
                    self._pending[key] = (state, commits[0])
                    continue
                after = apply_packed(state, commits[0])
            else:
                after = state
                for edit in commits:
                    after = apply_edit(after, edit)
            reason = check_held(state, after, bound) if bound is not None else None
            if reason is not None:
                self.over_bound[key] = reason
                continue
            self._basis[key] = record[0] if record is not None else -1
            self._new[key] = after
            self._stable[key] = after.stable
        for key, offset in self.plain.items():
            record = records.get(key)
            if record is not None and key not in self._new and key not in self.over_bound:
                self._new[key] = apply_plain(offset, record[1])
                self._basis.setdefault(key, record[0])
        self.phase = _Phase.FORWARDED
        return Forward(dict(self._stable), {key: _OVER_BOUND for key in self.over_bound})

    def unavailable(self) -> dict[TopicPartitionKey, int]:
        """The state could not be read: every range commit is refused (retriable), and
        nothing is written for this request. Returns the refusals."""
        self._expect(_Phase.PLANNING)
        self._new, self._stable, self._pending = {}, {}, {}
        self.phase = _Phase.FORWARDED
        return {key: _UNAVAILABLE for key in self.commits}

    def planned(self, key: TopicPartitionKey) -> CommitState | None:
        """The state ``key`` is to have (after ``on_committed``; a single range commit's
        only after ``prepare``)."""
        return self._new.get(key)

    @property
    def needs_prepare(self) -> bool:
        return bool(self._pending)

    def prepare(self) -> None:
        """R' and the log values of single-commit keys: CPU work the edge runs while the
        broker handles the commit (``on_response`` does it if still needed)."""
        for key, (state, ranges) in self._pending.items():
            merged = self._new[key] = apply_packed(state, ranges)
            self._encoded[key] = (merged, encode_value(merged))
        self._pending = {}

    # -- response transform -----------------------------------------------------------------------
    def on_response(self, results) -> ReadLogEnd | Write | Answer:
        """The broker's answer: (key, error code) per partition. A partition it rejected
        changes nothing. (Still planning: no partition of the request needed the state.)"""
        self._expect(_Phase.PLANNING, _Phase.FORWARDED)
        self.prepare()
        self._accepted = {key: self._new[key] for key, error in results
                          if error == ErrorCode.NONE and key in self._new}
        if self._accepted and self._end_read:
            self.phase = _Phase.END_READ
            return ReadLogEnd()
        return self._write()

    def on_log_end(self, position: int, records: dict[TopicPartitionKey, AppliedState]) -> Correct | Write | ReadWindow | Answer:
        """The end read finished at ``position``; ``records``: what this instance holds now.
        A key whose newest record is no longer the one its state came from was written by
        another instance: the state is brought up to that record before anything is
        written."""
        self._expect(_Phase.END_READ)
        self._read = max(self._read, position)
        found: dict[TopicPartitionKey, CommitState | None] = {}
        for key in self._accepted:
            record = records.get(key)
            offset = record[0] if record is not None else -1
            if offset != self._basis.get(key, -1):
                found[key] = record[1] if record is not None else None
                self._basis[key] = offset  # merged now: a window need not merge it again
        if found:
            return self._merge(found, written=False)
        return self._write()

    def on_log_end_failed(self) -> Answer:
        """The log's end could not be read: nothing is written, every accepted key is
        answered COORDINATOR_NOT_AVAILABLE."""
        self._expect(_Phase.END_READ)
        for key in self._accepted:
            self._errors[key] = _UNAVAILABLE
        self._accepted = {}
        return self._answer()

    def on_corrected(self, errors: dict[TopicPartitionKey, int]) -> Write | ReadWindow | Answer:
        """The coordinator's error code per corrected key (a key it did not mention counts
        as COORDINATOR_NOT_AVAILABLE)."""
        self._expect(_Phase.CORRECTING)
        return self._corrected(errors)

    def on_correction_failed(self) -> Write | ReadWindow | Answer:
        """No coordinator answered the correction."""
        self._expect(_Phase.CORRECTING)
        return self._corrected({})

    def on_written(self, at: int) -> ReadWindow | Answer:
        """The write landed at log offset ``at`` (-1: unknown, an earlier attempt landed).
        Anywhere but right after what the states hold, another instance wrote in between."""
        self._expect(_Phase.WRITING, _Phase.REWRITING)
        if self.phase is _Phase.WRITING:
            if at == self._read:
                return self._answer()
            self._merged = {key: offset for key, offset in self._basis.items() if offset >= self._read}
            self._start, self._count, self._at = self._read, len(self._accepted), at
            return self._window()
        self._at = at
        if at == self._start:
            return self._answer()
        return self._window()

    def on_window(self, window: dict[TopicPartitionKey, tuple[int, CommitState | None]],
                  read_to: int) -> Correct | Write | ReadWindow | Answer:
        """The newest record of each key in the window (offset, state; None a tombstone),
        and the offset the read reached."""
        self._expect(_Phase.WINDOW)
        self._read_to = read_to
        found = {key: state for key, (offset, state) in window.items() if offset != self._merged.get(key)}
        return self._merge(found, written=True)

    def on_write_failed(self) -> Answer:
        """A write, or the read of a window, failed: every accepted key is answered
        COORDINATOR_NOT_AVAILABLE (a retry merges idempotently)."""
        self._expect(_Phase.WRITING, _Phase.REWRITING, _Phase.WINDOW)
        for key in self._accepted:
            self._errors[key] = _UNAVAILABLE
        return self._answer()

    # -- steps ------------------------------------------------------------------------------------
    def _write(self) -> Write | Answer:
        if not self._accepted:
            return self._answer()
        self.phase = _Phase.WRITING
        return Write(dict(self._accepted), self._encoded)

    def _window(self) -> ReadWindow | Answer:
        if self._rounds_done >= self.rounds:
            for key in self._accepted:
                self._errors.setdefault(key, _UNAVAILABLE)  # each record holds its commit whole
            return self._answer()
        self._rounds_done += 1
        self.phase = _Phase.WINDOW
        return ReadWindow(self._start, self._at if self._at >= 0 else None, frozenset(self._accepted))

    def _merge(self, found: dict[TopicPartitionKey, CommitState | None], *, written: bool) -> Correct | Write | ReadWindow | Answer:
        """Bring each range commit's state up to the newer record ``found`` of its key (in
        one epoch the union; after a reset or a deletion the commit applied again). When S
        changes, the coordinator (holding S computed from the older state) is corrected."""
        redo: dict[TopicPartitionKey, CommitState] = {}
        for key, state in found.items():
            self.foreign_writes += 1
            if key not in self.commits:
                continue  # a plain commit (S = O, R cleared) does not depend on the state
            state = rebase_commit(self._accepted[key], state, self.commits[key])
            if state != self._accepted[key]:
                redo[key] = state
        self._redo, self._written = redo, written
        self._corrections = {key: state.stable for key, state in redo.items()
                             if state.stable != self._stable.get(key)} if self.coordinator else {}
        if self._corrections:
            self.phase = _Phase.CORRECTING
            return Correct(dict(self._corrections))
        return self._corrected({})

    def _corrected(self, errors: dict[TopicPartitionKey, int]) -> Write | ReadWindow | Answer:
        for key, state in self._redo.items():
            error = errors.get(key, _UNAVAILABLE) if key in self._corrections else ErrorCode.NONE
            if error != ErrorCode.NONE:
                self._errors[key] = error
                if not self._written:
                    del self._accepted[key]  # nothing written yet: the key is left alone
                    continue
            elif key in self._corrections:
                self._stable[key] = state.stable
            self._accepted[key] = state
        if not self._written:
            return self._write()
        if not self._redo:
            return self._answer()
        self._start = self._at + self._count if self._at >= 0 else self._read_to
        self._count = len(self._redo)
        self.phase = _Phase.REWRITING
        return Write(dict(self._redo))

    def _answer(self) -> Answer:
        self.phase = _Phase.DONE
        stable = {key: state.stable for key, state in self._accepted.items()
                  if key in self.commits and key not in self._errors}
        return Answer(dict(self._errors), stable)


def lift_commit(records: dict[TopicPartitionKey, AppliedState], floors: dict[TopicPartitionKey, int],
                position: int) -> tuple[RangeCommit, Write] | None:
    """A lift of the log to the coordinator's committed offsets (``floors``) where they are
    above the log's S (``records``: what this instance read, up to ``position``): a range
    commit of ``Floor`` edits that forwards nothing, at its first write. None when no key
    needs one (a key the log holds no record of is served from the coordinator alone)."""
    edits: dict[TopicPartitionKey, list[Edit]] = {
        key: [Floor(floor, record[1].epoch)] for key, floor in floors.items()
        if (record := records.get(key)) is not None and floor > record[1].stable}
    if not edits:
        return None
    commit = RangeCommit(edits, coordinator=False)
    forward = commit.begin(position, records, end_read=False)
    assert isinstance(forward, Forward)  # every key has a record: S' is known without the coordinator
    write = commit.on_response([(key, int(ErrorCode.NONE)) for key in forward.offsets])
    assert isinstance(write, Write)  # no log end read, nothing refused: the write comes first
    return commit, write
