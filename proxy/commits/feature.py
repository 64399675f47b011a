"""The I/O edge of individual commit: OffsetCommit, OffsetFetch, DeleteGroups and
OffsetDelete hooks on the router, and their metrics (docs/wire-contract.md#33-offsetcommit to #4-individual-commit-log).

Write order of a range commit (docs/individual-commit.md explains why):

1. In the request hook, under a per-(group, topic, partition) lock: compute S' from the
   state this instance holds and forward a standard OffsetCommit carrying S' for those
   partitions; the group's log partition is read to its end alongside (first use: before).
   R' and the log values are computed while the broker works.
2. The broker checks generation and membership and stores S'. A partition it rejects
   changes nothing: no log write, no memory change.
3. In the response transform, for partitions the broker accepted: once the log's end is
   read, a key another instance wrote meanwhile is merged again from that record (and the
   coordinator given the corrected S if it differs) (``_verify``); then the states are
   written to the log with acks=all. If that write did not land right where the read
   ended, another instance wrote in between: a key it wrote there is merged again and
   written again (``_reconcile``). Only then does the response (with StableOffset) leave.
   If the end cannot be read or a write fails, the partition is answered
   COORDINATOR_NOT_AVAILABLE (retriable), so no commit is acknowledged that is not in the
   log's newest record of its key.
"""

from __future__ import annotations

import logging
from collections import deque

import trio
from prometheus_client import Counter, Gauge, Histogram

from proxy.commits.log import Cluster, CommitLog, CommitLogError, encode_value
from proxy.commits.state import CommitState, apply_packed, apply_plain, check_packed, rebase, rebase_commit, stable_after
from proxy.commits.wire import forward_frame, parse_request, parse_response, rewrite_response
from proxy.protocol import messages
from proxy.protocol.framing import RequestHeaderPeek
from proxy.protocol.messages import ApiKey
from proxy.server.exchange import LocalAnswer
from proxy.server.routing import Route

log = logging.getLogger("proxy.commits")

FEATURE = "individual.commit"
_TAG_10000 = bytes([0x90, 0x4E])
_FIRST_RANGE_COMMIT = 8
_FIRST_RANGE_FETCH = 6
INVALID_REQUEST = 42
COORDINATOR_NOT_AVAILABLE = 15
_RECONCILE_ROUNDS = 8  # rounds of merging another instance's concurrent writes
_LOG_LOOKUP_INTERVAL = 5.0  # seconds between looks for a log topic not seen yet (plain commits)

Key = tuple[str, int]


class _KeyLocks:
    """Serialises commits to one (group, topic, partition) across connections. A holder
    releases when its response transform has run, or when its connection ends.

    A held key maps to the queue of its waiters (empty when none); ownership passes to the
    first waiter on release. Taking a free key costs a dict insertion, no scheduling."""

    def __init__(self) -> None:
        self._held: dict[tuple, deque[trio.Event]] = {}

    async def acquire(self, keys: list[tuple]) -> None:
        taken = []
        try:
            for key in sorted(keys):
                waiters = self._held.get(key)
                if waiters is None:
                    self._held[key] = deque()
                else:
                    handed = trio.Event()
                    waiters.append(handed)
                    try:
                        await handed.wait()
                    except BaseException:
                        if handed.is_set():
                            taken.append(key)  # handed over as we were cancelled: ours to release
                        else:
                            waiters.remove(handed)
                        raise
                taken.append(key)
        except BaseException:
            self.release(taken)
            raise

    def release(self, keys) -> None:
        for key in keys:
            waiters = self._held[key]
            if waiters:
                waiters.popleft().set()
            else:
                del self._held[key]


class _EndCheck:
    """The log-end read that runs concurrently with the broker's OffsetCommit."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: CommitLogError | None = None
        self.position = -1  # where the read ended: every record below it was in memory


class IndividualCommitFeature:
    def __init__(self, config, router, metrics, *, ssl_context=None) -> None:
        self.router = router
        self.enabled = config.get("accept.individual.commit")
        self.max_ranges = config.get("max.individual.commit.ranges")
        registry = metrics.registry
        self._commits = Counter("kafka_proxy_individual_commit_range_commits",
                                "Partitions committed with offset ranges and acknowledged.", registry=registry)
        self._refused = Counter("kafka_proxy_individual_commit_refused",
                                "Partitions of range commits refused, by reason.", ["reason"], registry=registry)
        self._held = Gauge("kafka_proxy_individual_commit_ranges_held",
                           "Ranges above the stable offset held in the state this instance has read.",
                           registry=registry)
        self._write_latency = Histogram("kafka_proxy_individual_commit_log_write_seconds",
                                        "Time to write states to __individual_commit_offsets (acks=all).",
                                        buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
                                        registry=registry)
        self._foreign = Counter("kafka_proxy_individual_commit_foreign_writes",
                                "Committed partitions whose state another instance wrote since this one read it.",
                                registry=registry)
        self._rebuilds = Counter("kafka_proxy_individual_commit_state_rebuilds",
                                 "Log partitions read from the start to rebuild state.", registry=registry)
        timeout = config.get("upstream.connect.timeout.ms") / 1000
        self.log = CommitLog(
            Cluster(config.get("bootstrap.servers"), ssl_context=ssl_context, timeout=timeout),
            segment_bytes=config.get("individual.commit.log.segment.bytes"),
            on_rebuild=self._rebuilds.inc,
            on_write=self._write_latency.observe,
        )
        self._locks = _KeyLocks()
        self._log_looked_up_at = -_LOG_LOOKUP_INTERVAL
        router.register(ApiKey.OFFSET_COMMIT, self.on_offset_commit)
        if self.enabled:
            router.register(ApiKey.OFFSET_FETCH, self.on_offset_fetch)
            router.register(ApiKey.DELETE_GROUPS, self.on_delete_groups)
            router.register(ApiKey.OFFSET_DELETE, self.on_offset_delete)
            router.advertise(FEATURE)

    def _topic_name(self, topic) -> str:
        name = getattr(topic, "name", "") or ""
        if not name:
            topic_id = getattr(topic, "topic_id", None)
            if topic_id is not None:
                name = self.router.topic_names.get(topic_id, "")
        return name

    def _export(self) -> None:
        self._held.set(self.log.ranges_held())

    # -- OffsetCommit ---------------------------------------------------------------------------
    async def on_offset_commit(self, conn, peek: RequestHeaderPeek, frame: bytes) -> Route | None:
        version = peek.api_version
        if version < _FIRST_RANGE_COMMIT:
            return None
        has_ranges = _TAG_10000 in frame
        if not has_ranges and not self.enabled:
            return None
        request = parse_request(frame)
        group = request.group
        names = [self._topic_name(topic) for topic in request.topics]
        refused: dict[Key, int] = {}
        range_commits: dict[Key, list] = {}
        plain: dict[Key, int] = {}
        for name, topic in zip(names, request.topics):
            for part in topic.partitions:
                key = (name, part.index)
                ranges = part.packed
                if not ranges:
                    plain[key] = part.committed_offset
                    continue
                if not self.enabled:
                    refused[key] = INVALID_REQUEST
                    self._refused.labels("disabled").inc()
                    continue
                reason, ordered = check_packed(part.committed_offset, ranges, self.max_ranges)
                if reason is not None:
                    log.info("refusing range commit group=%s topic=%s partition=%s reason=%r", group, name,
                             part.index, reason)
                    refused[key] = INVALID_REQUEST
                    self._refused.labels("invalid").inc()
                    continue
                range_commits.setdefault(key, []).append(ordered)
        if not range_commits and not refused:
            if not self.enabled or not await self._has_state(group, plain):
                return None

        # Plain commits of partitions that hold state reset it (S = O, R cleared).
        known = self.log.groups.get(group, {}) if self.enabled else {}
        locked = [(group, *key) for key in {*range_commits, *(key for key in plain if key in known)}]
        done = trio.Event()
        if locked:
            await self._locks.acquire(locked)
            conn.nursery.start_soon(self._hold, locked, done)
        new: dict[Key, CommitState] = {}
        stable: dict[Key, int] = {}  # S' of each range commit, what the broker gets
        later: dict[Key, tuple[CommitState, list]] = {}  # R' computed once the request is on its way
        basis: dict[Key, int] = {}  # log offset of the record each new state was computed from
        check: _EndCheck | None = None
        seen = 0
        try:
            if locked:
                if self.log.current(group):
                    # Optimistic: compute from what this instance has read, and read the
                    # log's end concurrently with the broker's commit (merged before any
                    # log write; see docs/individual-commit.md).
                    check = _EndCheck()
                    conn.nursery.start_soon(self._check_end, group, check)
                else:
                    await self.log.catch_up(group)  # first use: read to the log's end first
                # Every record below ``seen`` is in memory now: the states computed next
                # (and brought up to the end read by ``_verify``) include them. A write
                # landing anywhere else is checked by ``_reconcile``.
                seen = self.log.position(group)
                records = self.log.records(group)
                missing = [key for key in range_commits if key not in records]
                coordinator = await self.log.cluster.committed_offsets(group, missing) if missing else {}
                for key, commits in range_commits.items():
                    record = records.get(key)
                    basis[key] = record[0] if record is not None else -1
                    state = record[1] if record is not None else CommitState(max(coordinator.get(key, -1), 0))
                    if len(commits) == 1:
                        # The broker needs only S'; R' (and the log value) is computed while
                        # the broker works.
                        stable[key] = stable_after(state, commits[0])
                        later[key] = (state, commits[0])
                        continue
                    for ranges in commits:
                        state = apply_packed(state, ranges)
                    new[key] = state
                    stable[key] = state.stable
                for key, offset in plain.items():
                    if key in records and key not in new:
                        new[key] = apply_plain(offset, records[key][1])
        except CommitLogError as exc:
            log.warning("individual-commit state unavailable group=%s reason=%r", group, str(exc))
            for key in range_commits:
                refused[key] = COORDINATOR_NOT_AVAILABLE
            new, stable, later = {}, {}, {}
        except BaseException:
            done.set()
            raise

        offsets = {}
        for number, (name, topic) in enumerate(zip(names, request.topics)):
            for part in topic.partitions:
                key = (name, part.index)
                if key in stable:
                    offsets[(number, part.index)] = stable[key]
        upstream = forward_frame(request, lambda number, part: (names[number], part.index) not in refused, offsets)
        if not any((names[number], part.index) not in refused
                   for number, topic in enumerate(request.topics) for part in topic.partitions):
            done.set()
            answer = LocalAnswer()
            response = messages.new_body(ApiKey.OFFSET_COMMIT, version, "response")
            self._add_refused(response, refused)
            answer.set(messages.encode_response(ApiKey.OFFSET_COMMIT, version,
                                                messages.new_response_header(peek.correlation_id), response))
            return Route(None, local=answer)
        encoded: dict[Key, tuple[CommitState, bytes]] = {}
        prepared = None
        if later:
            prepared = trio.Event()
            conn.nursery.start_soon(self._prepare, later, new, encoded, prepared)

        async def transform(raw: bytes) -> bytes:
            try:
                if prepared is not None:
                    await prepared.wait()
                # The broker's answer as brokers send it is rewritten from slices; anything
                # else (and a response that must list refused partitions) through the codec.
                parsed = parse_response(raw, version) if not refused else None
                if parsed is not None:
                    response_names = [self._topic_name(topic) for topic in parsed.topics]
                    results = [((name, part.index), part.error_code)
                               for name, topic in zip(response_names, parsed.topics) for part in topic.partitions]
                else:
                    response_header, response = messages.decode_response(ApiKey.OFFSET_COMMIT, version, raw)
                    results = [((self._topic_name(topic), part.partition_index), part.error_code)
                               for topic in response.topics for part in topic.partitions]
                accepted: dict[Key, CommitState] = {key: new[key] for key, error in results
                                                    if error == 0 and key in new}
                errors: dict[Key, int] = {}
                if accepted and check is not None:
                    await self._verify(request, check, range_commits, stable, basis, accepted, errors)
                written = True
                # The states hold every record below ``read``: where the log was read to
                # when they were computed, or by the end read they were brought up to.
                read = max(seen, check.position) if check is not None else seen
                if accepted:
                    try:
                        at = await self.log.write(group, accepted, encoded)
                        if at != read:
                            # The log moved between the read and this write: merge again
                            # what another instance wrote meanwhile, and write that.
                            merged = {key: offset for key, offset in basis.items() if offset >= read}
                            await self._reconcile(request, range_commits, stable, accepted, merged, read, at, errors)
                    except CommitLogError as exc:
                        log.error("individual-commit log write failed group=%s reason=%r", group, str(exc))
                        written = False
                answered: dict[Key, int] = {}
                for key, state in accepted.items():
                    if not written:
                        errors[key] = COORDINATOR_NOT_AVAILABLE
                    elif key in range_commits and key not in errors:
                        answered[key] = state.stable
                if answered:
                    self._commits.inc(len(answered))
                self._export()
                if parsed is not None:
                    return rewrite_response(parsed, response_names, errors, answered)
                for topic in response.topics:
                    name = self._topic_name(topic)
                    for part in topic.partitions:
                        key = (name, part.partition_index)
                        if key in errors:
                            part.error_code = errors[key]
                        if key in answered:
                            part.stable_offset = answered[key]
                self._add_refused(response, refused)
                return messages.encode_response(ApiKey.OFFSET_COMMIT, version, response_header, response)
            finally:
                done.set()

        return Route(upstream, transform=transform)

    async def _prepare(self, later: dict[Key, tuple[CommitState, list]], new: dict[Key, CommitState],
                       encoded: dict[Key, tuple[CommitState, bytes]], ready: trio.Event) -> None:
        """R' and the log values of the commit, computed while the broker handles it."""
        try:
            # Let the connection's reader send the request to the broker first (not needed
            # for correctness: the transform waits for ``ready`` whatever the order).
            await trio.lowlevel.checkpoint()
            await trio.lowlevel.checkpoint()
            for key, (state, ranges) in later.items():
                merged = new[key] = apply_packed(state, ranges)
                encoded[key] = (merged, encode_value(merged))
        finally:
            ready.set()

    async def _check_end(self, group: str, check: "_EndCheck") -> None:
        try:
            await self.log.catch_up(group)
            check.position = self.log.position(group)
        except CommitLogError as exc:
            check.error = exc
        finally:
            check.done.set()

    async def _verify(self, request, check: "_EndCheck", range_commits: dict[Key, list], coordinator: dict[Key, int],
                      basis: dict[Key, int], accepted: dict[Key, CommitState], failed: dict[Key, int]) -> None:
        """Bring ``accepted`` up to the log's end read alongside the broker's commit, before
        anything is written: a key whose newest record is no longer the one its state was
        computed from (another instance wrote it) is merged again from that record. That
        read started after the client's request arrived, so every commit acknowledged
        before it is merged. If the end cannot be read, nothing is written and every key
        is answered COORDINATOR_NOT_AVAILABLE."""
        await check.done.wait()
        if check.error is not None:
            log.warning("individual-commit log end unknown group=%s reason=%r", request.group, str(check.error))
            for key in list(accepted):
                failed[key] = COORDINATOR_NOT_AVAILABLE
                del accepted[key]
            return
        records = self.log.records(request.group)
        found = {}
        for key in accepted:
            record = records.get(key)
            offset = record[0] if record is not None else -1
            if offset != basis.get(key, -1):
                found[key] = record[1] if record is not None else None
                basis[key] = offset  # merged: ``_reconcile`` need not merge it again
        if found:
            await self._merge_again(request, range_commits, coordinator, accepted, found, failed, written=False)

    async def _reconcile(self, request, range_commits: dict[Key, list], coordinator: dict[Key, int],
                         accepted: dict[Key, CommitState], merged: dict[Key, int], seen: int, at: int,
                         failed: dict[Key, int]) -> None:
        """Make the log's newest record of every accepted key hold its commit, once the log
        is known to have moved between the read the states were brought up to (``seen``)
        and their write (at ``at``; -1 unknown): another instance wrote in between.

        A record of one of these keys in that window is shadowed by this write. The state
        is brought up to it (``rebase_commit``: in one epoch, the union of the two) and
        written, until a round finds nothing new: then this instance's newest record holds
        the commit and everything the shadowed records held. Rounds are bounded: past the
        last, the keys are answered COORDINATOR_NOT_AVAILABLE (their records hold the
        commit whole). ``merged``: the record of a key at or above ``seen`` that the state
        already holds."""
        group = request.group
        start, written = seen, len(accepted)
        for _ in range(_RECONCILE_ROUNDS):
            window, read_to = await self.log.window(group, start, at if at >= 0 else None, accepted)
            found = {key: state for key, (offset, state) in window.items() if offset != merged.get(key)}
            redo = await self._merge_again(request, range_commits, coordinator, accepted, found, failed, written=True)
            if not redo:
                return
            start = at + written if at >= 0 else read_to
            written = len(redo)
            at = await self.log.write(group, redo)
            if at == start:
                return
        for key in accepted:
            failed.setdefault(key, COORDINATOR_NOT_AVAILABLE)

    async def _merge_again(self, request, range_commits: dict[Key, list], coordinator: dict[Key, int],
                           accepted: dict[Key, CommitState], found: dict[Key, CommitState | None],
                           failed: dict[Key, int], *, written: bool) -> dict:
        """Bring each range commit's state up to the newer record ``found`` of its key
        (``rebase_commit``: joined in one epoch, the commit applied again after a reset or
        a deletion). The states that change replace ``accepted`` and are returned. When S
        changes, the coordinator (which holds S computed from the older state) gets the new
        S through the proxy's own connection, with the client's generation and member; a
        key whose correction it refuses is answered with that error, and, if nothing is
        ``written`` yet, dropped (a retry is idempotent)."""
        redo: dict[Key, CommitState] = {}
        for key, state in found.items():
            self._foreign.inc()
            if key not in range_commits:
                continue  # a plain commit (S = O, R cleared) does not depend on the state
            state = rebase_commit(accepted[key], state, range_commits[key])
            if state != accepted[key]:
                redo[key] = state
        corrections = {key: state.stable for key, state in redo.items() if state.stable != coordinator.get(key)}
        errors = {}
        if corrections:
            try:
                errors = await self.log.cluster.commit_offsets(request.group, request.generation, request.member,
                                                               request.instance_id, corrections)
            except CommitLogError as exc:
                log.warning("individual-commit correction failed group=%s reason=%r", request.group, str(exc))
        for key, state in redo.items():
            error = errors.get(key, COORDINATOR_NOT_AVAILABLE) if key in corrections else 0
            if error:
                failed[key] = error
                if not written:
                    del accepted[key]
                    continue
            elif key in corrections:
                coordinator[key] = state.stable
            accepted[key] = state
        return redo

    async def _hold(self, keys, done: trio.Event) -> None:
        try:
            await done.wait()
        finally:
            self._locks.release(keys)

    async def _has_state(self, group: str, plain: dict[Key, int]) -> bool:
        """Whether a plain commit may touch state. Reads the group's log partition when
        this instance has never read it; afterwards what it read is trusted for plain
        commits (range commits and fetches always read to the log's end)."""
        if self.log.current(group):
            return group in self.log.groups and any(key in self.log.groups[group] for key in plain)
        if self.log.partitions is None:
            # No log seen yet: look again at most every few seconds, so standard commits
            # do not each pay a Metadata request while nobody uses individual commit.
            now = trio.current_time()
            if now - self._log_looked_up_at < _LOG_LOOKUP_INTERVAL:
                return False
            self._log_looked_up_at = now
        try:
            # The log exists but this instance has not read the group's log partition yet
            # (another instance wrote it): read it once, so the plain commit resets any
            # state there. Later plain commits of groups on that partition trust memory.
            await self.log.catch_up(group)
        except CommitLogError:
            return False
        return group in self.log.groups and any(key in self.log.groups[group] for key in plain)

    def _add_refused(self, response, refused: dict[Key, int]) -> None:
        if not refused:
            return
        cls = messages.body_class(ApiKey.OFFSET_COMMIT, "response")
        by_topic: dict[str, list] = {}
        for (name, partition), error in refused.items():
            by_topic.setdefault(name, []).append(cls.OffsetCommitResponsePartition(partition_index=partition,
                                                                                   error_code=error))
        existing = {topic.name: topic for topic in response.topics}
        for name, parts in by_topic.items():
            if name in existing:
                existing[name].partitions.extend(parts)
            else:
                response.topics.append(cls.OffsetCommitResponseTopic(name=name, partitions=parts))

    # -- OffsetFetch ----------------------------------------------------------------------------
    async def on_offset_fetch(self, conn, peek: RequestHeaderPeek, frame: bytes) -> Route | None:
        version = peek.api_version
        if version < _FIRST_RANGE_FETCH:
            return None
        single_group = None
        if version < 8:
            _, request = messages.decode_request(frame)
            single_group = request.group_id

        async def transform(raw: bytes) -> bytes:
            response_header, response = messages.decode_response(ApiKey.OFFSET_FETCH, version, raw)
            if version >= 8:
                groups = [(entry.group_id, entry.topics, entry) for entry in response.groups]
            else:
                groups = [(single_group, response.topics, response)]
            changed = False
            for group, topics, holder in groups:
                if holder.error_code:
                    continue
                try:
                    states = await self.log.states(group)
                except CommitLogError as exc:
                    if self.log.partitions is None:
                        # This instance has never seen the log (and cannot reach it, e.g.
                        # the brokers require authentication the proxy does not have): it
                        # holds no state to add; the standard answer stands.
                        log.debug("individual-commit log unavailable group=%s reason=%r", group, str(exc))
                        continue
                    # Never serve state older than the log: a retriable error instead.
                    log.warning("individual-commit log unreadable group=%s reason=%r", group, str(exc))
                    holder.error_code = COORDINATOR_NOT_AVAILABLE
                    changed = True
                    continue
                if states and self._merge_fetched(topics, states, version):
                    changed = True
            if not changed:
                return raw
            self._export()
            return messages.encode_response(ApiKey.OFFSET_FETCH, version, response_header, response)

        return Route(frame, transform=transform)

    def _merge_fetched(self, topics, states: dict[Key, CommitState], version: int) -> bool:
        cls = messages.body_class(ApiKey.OFFSET_FETCH, "response")
        changed = False
        for topic in topics:
            name = self._topic_name(topic)
            for part in topic.partitions:
                state = states.get((name, part.partition_index))
                if state is None or part.error_code:
                    continue
                merged = rebase(state, part.committed_offset) if part.committed_offset >= 0 else state
                part.committed_offset = merged.stable
                part.committed_range_offsets = [cls.OffsetRange(start=start, end=end) for start, end in merged.ranges]
                changed = True
        return changed

    # -- deletion ---------------------------------------------------------------------------------
    async def on_delete_groups(self, conn, peek: RequestHeaderPeek, frame: bytes) -> Route | None:
        version = peek.api_version

        async def transform(raw: bytes) -> bytes:
            _, response = messages.decode_response(ApiKey.DELETE_GROUPS, version, raw)
            for result in response.results:
                if result.error_code == 0:
                    await self._tombstone(result.group_id, None)
            return raw

        return Route(frame, transform=transform)

    async def on_offset_delete(self, conn, peek: RequestHeaderPeek, frame: bytes) -> Route | None:
        version = peek.api_version
        _, request = messages.decode_request(frame)
        group = request.group_id

        async def transform(raw: bytes) -> bytes:
            _, response = messages.decode_response(ApiKey.OFFSET_DELETE, version, raw)
            if response.error_code == 0:
                deleted = {(topic.name, part.partition_index) for topic in response.topics
                           for part in topic.partitions if part.error_code == 0}
                await self._tombstone(group, deleted)
            return raw

        return Route(frame, transform=transform)

    async def _tombstone(self, group: str, keys: set[Key] | None) -> None:
        try:
            states = await self.log.states(group)
            doomed = [key for key in states if keys is None or key in keys]
            if not doomed:
                return
            locks = [(group, *key) for key in doomed]
            await self._locks.acquire(locks)
            try:
                await self.log.write(group, {key: None for key in doomed})
            finally:
                self._locks.release(locks)
            self._export()
        except CommitLogError as exc:
            log.error("cannot delete individual-commit state group=%s reason=%r", group, str(exc))
