"""Frame splitting and the cheap peeks that route a frame before (or instead of) decoding it.

These run on every byte a client or a broker sends, before any schema is consulted, and
the relayed Fetch path never decodes at all: the walk over a Fetch response decides where
the rewritable tail starts while the rest of the frame streams past the proxy. So besides
"only ProtocolError escapes", this target checks what the relay relies on:

* a stream split as it arrives in arbitrary pieces, or with each body read in place after
  ``take_start`` (the socket path of ``net/streams.py``), gives the same frames as the
  stream split whole;
* the streaming walk never reads a byte it was not yet given, nor one before the point it
  declared forwardable, and finds the same tail as the walk over the complete frame;
* every Fetch response the codec accepts, the walk accepts too (a valid response must
  never close a connection), and the tail rewrite keeps the tail's length exactly;
* the native relay's reads (``proxy/net/_cpump.c``) agree with the Python ones: the acks
  of a Produce request, and a Produce response is passed on untouched only when it holds
  no leader hints the codec would find, nor a count over the limits the codec refuses;
* the limit on a request header's tagged fields (``MAX_TAGGED_FIELDS``): the cheap check
  every request goes through (``check_request_header_tags``) refuses what the codec
  refuses for it and counts what the codec decodes, and the native relay carries a
  request with a flexible header exactly when that check, given the bytes the relay
  peeks at, accepts it (a Fetch only when it is plain, too);
* the native relay carries a Fetch request exactly when its Python reference
  (``proxy.net.native_checks``) says it may, with and without the virtual-topic guard,
  and never one the codec finds an extension in (key ranges, a cooperative partition) or
  a name that may be a virtual topic's; and its walk over a Fetch response, arriving in
  pieces, finds the tail where the Python walk does, and refuses what it refuses;
* the native relay answers a key-range Fetch from its table exactly when its Python
  reference (``native_checks.answer_keys``) says it may, only one the codec decodes, by the
  keys the cache holds its shares under, never with a share above its partition's limit,
  and with those shares cached (within their limits) its answer is the
  event loop's, byte for byte.

Input: three control bytes, then the byte stream of size-prefixed frames. The first
control byte holds the frame size limit (bits 0-1), the Fetch version the frames are read
as when taken for responses (12 + bits 2-4), the Produce version likewise (10 + bits 5-6),
and whether the proxy's advertised host is long enough to overflow the tail (bit 7); the
other two are the sizes of the pieces the stream arrives in.
"""

from __future__ import annotations

import uuid

from fuzz.common import Choices, InvariantBroken, check_not_internal
from proxy.features.addresses import rewrite_fetch_tail
from proxy.keyrange.cache import CachedShare
from proxy.keyrange.engine import ConnectionRanges, KeyRangeEngine
from proxy.keyrange.native import NativeShares, answer_key, served_entry
from proxy.keyrange.requests import FetchRangeSessions, topic_key
from proxy.keyrange.settings import KeyRangeTopicSettings
from proxy.net import native_checks, native_table
from proxy.net.native_relay import _cpump
from proxy.protocol import messages
from proxy.protocol.api_keys import ApiKey
from proxy.protocol.errors import ProtocolError, UnsupportedVersionError
from proxy.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    SIZE_PREFIX,
    FrameSplitter,
    check_request_header_tags,
    peek_correlation_id,
    peek_request_header,
)
from proxy.protocol.message_types import FetchResponse as FetchResponseBody
from proxy.protocol.message_versions import (
    FETCH_FIRST_FLEXIBLE,
    FETCH_FIRST_NODE_ENDPOINTS,
    FETCH_FIRST_TOPIC_ID,
    PRODUCE_FIRST_NODE_ENDPOINTS,
)
from proxy.protocol.peek import (
    NODE_ENDPOINTS_TAG,
    fetch_response_tail,
    has_tag,
    produce_acks,
    walk_fetch_response,
)
from proxy.virtual.precheck import names_suffix

# The limits a proxy may be configured with, down to the smallest max.frame.bytes allowed.
FRAME_LIMITS = (DEFAULT_MAX_FRAME_BYTES, 1024, 4096, 1 << 16)
FIRST_FLEXIBLE_FETCH = FETCH_FIRST_FLEXIBLE
FIRST_HINTED_PRODUCE = PRODUCE_FIRST_NODE_ENDPOINTS  # 10..13: the Produce versions whose responses may carry leader hints
FETCH_VERSIONS = 7  # 12..18
_TOPIC_SETTINGS = KeyRangeTopicSettings()
MAX_FRAMES = 8  # frames past these add time, not coverage
LIMIT = "exceeds the limit"  # the reason of every refusal of a count over MAX_ARRAY_ELEMENTS or MAX_TAGGED_FIELDS
NATIVE_PEEK = 1024  # how many bytes of a request (size prefix included) the native relay peeks at
NATIVE_KEYS, NATIVE_VERSIONS = native_table.KEYS, native_table.VERSIONS


def _every_request_native() -> bytes | None:
    """A native relay table that carries every request, each flagged as the chain flags it
    (``FeatureChain.native_classes``): flexible headers have their tag count checked."""
    if _cpump is None:
        return None
    return bytes(native_table.entry(native_table.NativeClass.OPAQUE, messages.request_header_flexible(key, version))
                 for key in range(NATIVE_KEYS) for version in range(NATIVE_VERSIONS))


_EVERY_REQUEST_NATIVE = _every_request_native()

# A guard as a proxy with virtual topics on hands the loop: the seeds name "orders" and "old"
# (by name, or by ids made from their names), and "orders.kr4", a virtual topic.
_GUARD = native_table.guard_blob([b".kr", b".coop"], [uuid.uuid5(uuid.NAMESPACE_DNS, "orders.kr4").bytes])
_KNOWN = native_table.known_blob([uuid.uuid5(uuid.NAMESPACE_DNS, name).bytes for name in ("orders", "old")])


def _fetch_native(guarded: bool) -> bytes:
    """A table carrying Fetch as a production chain does: FETCH where the walk applies."""
    table = native_table.new_table()
    for version in range(NATIVE_VERSIONS):
        cls = native_table.NativeClass.FETCH if version >= FIRST_FLEXIBLE_FETCH else native_table.NativeClass.OPAQUE
        native_table.put(table, ApiKey.FETCH, version, native_table.entry(
            cls, messages.request_header_flexible(ApiKey.FETCH, version), guarded))
    return bytes(table)


_FETCH_NATIVE = {guarded: _fetch_native(guarded) for guarded in (False, True)}


class _Book:
    """An address book that hands out a host as long as the input asks for, so that a
    rewrite that no longer fits (and has to drop the hints) is reachable too."""

    def __init__(self, host_length: int) -> None:
        self.host = "p" * max(1, host_length)

    def learn(self, node_id: int, host: str, port: int) -> None:
        pass

    def advertised(self, node_id: int) -> tuple[str, int]:
        return self.host, 9000 + node_id % 1000


class _Guarded:
    """A frame buffer that refuses reads the relay contract forbids: bytes not received
    yet (at or past ``filled``) and bytes already forwarded (before ``floor``)."""

    __slots__ = ("data", "filled", "floor")

    def __init__(self, data: bytes, filled: int) -> None:
        self.data = data
        self.filled = filled
        self.floor = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> int:
        if not isinstance(index, int):
            raise InvariantBroken(f"the Fetch walk sliced the frame ({index!r})")
        if index < self.floor:
            raise InvariantBroken(f"the Fetch walk read byte {index} after declaring bytes before {self.floor} forwardable")
        if index >= self.filled:
            raise InvariantBroken(f"the Fetch walk read byte {index} with only {self.filled} received")
        return self.data[index]


def _chunk_sizes(choices: Choices, stream_bytes: int) -> tuple[int, int]:
    """Two piece sizes the stream alternates between; at least 1/256 of the stream, so a
    large input arrives in a few hundred pieces rather than byte by byte."""
    floor = max(1, stream_bytes // 256)
    return max(floor, 1 + choices.byte()), max(floor, 1 + 7 * choices.byte())


# Frames of these API keys are held to a lower limit, as a connection's authentication
# requests are (FrameSplitter.limit_early): their key follows the size prefix, so the three
# ways of splitting must agree however the two bytes after a size arrive.
EARLY_LIMIT = (300, "early", frozenset({18, 17, 36}))


def _splitter(limit: int) -> FrameSplitter:
    splitter = FrameSplitter(limit)
    splitter.limit_early(EARLY_LIMIT)
    return splitter


def _split_whole(stream: bytes, limit: int) -> tuple[list[bytes], bool]:
    splitter = _splitter(limit)
    splitter.feed(stream)
    frames: list[bytes] = []
    try:
        while (frame := splitter.next_frame()) is not None:
            frames.append(frame)
    except ProtocolError:
        return frames, True
    return frames, False


def _split_chunked(stream: bytes, limit: int, sizes: tuple[int, int]) -> tuple[list[bytes], bool]:
    splitter = _splitter(limit)
    frames: list[bytes] = []
    pos = turn = 0
    try:
        while pos < len(stream):
            size = sizes[turn % 2]
            turn += 1
            splitter.feed(memoryview(stream)[pos:pos + size])
            pos += size
            while (frame := splitter.next_frame()) is not None:
                frames.append(frame)
    except ProtocolError:
        return frames, True
    return frames, False


def _split_in_place(stream: bytes, limit: int, sizes: tuple[int, int]) -> tuple[list[bytes], bool]:
    """As the socket path reads: the splitter sees the size prefix and whatever arrived
    with it; the rest of the body goes straight from the source into the frame."""
    splitter = _splitter(limit)
    frames: list[bytes] = []
    pos = turn = 0
    try:
        while True:
            size = splitter.next_size()
            if size is None:
                if pos >= len(stream):
                    break
                chunk = sizes[turn % 2]
                turn += 1
                splitter.feed(stream[pos:pos + chunk])
                pos = min(len(stream), pos + chunk)
                continue
            if splitter.buffered - 4 + len(stream) - pos < size:
                break  # the stream ends inside this body (checked first: sizes go up to 100 MiB)
            frame = bytearray(size)
            got = splitter.take_start(memoryview(frame))
            rest = stream[pos:pos + size - got]
            frame[got:] = rest
            pos += len(rest)
            frames.append(bytes(frame))
    except ProtocolError:
        return frames, True
    return frames, False


def _check_splitting(stream: bytes, limit: int, sizes: tuple[int, int]) -> list[bytes]:
    whole, whole_failed = _split_whole(stream, limit)
    chunked, chunked_failed = _split_chunked(stream, limit, sizes)
    if (chunked, chunked_failed) != (whole, whole_failed):
        raise InvariantBroken(f"chunked split gave {len(chunked)} frames (failed={chunked_failed}), "
                              f"whole split {len(whole)} (failed={whole_failed})")
    in_place, in_place_failed = _split_in_place(stream, limit, sizes)
    if (in_place, in_place_failed) != (whole, whole_failed):
        raise InvariantBroken(f"in-place split gave {len(in_place)} frames (failed={in_place_failed}), "
                              f"whole split {len(whole)} (failed={whole_failed})")
    return whole


def _check_header_tags(frame: bytes, api_key: int, version: int, header, refusal: ProtocolError | None) -> None:
    """The header's tagged-field count as the per-request check, the codec and the native
    relay read it."""
    flexible = messages.request_header_flexible(api_key, version)
    try:
        count = check_request_header_tags(frame, flexible)
        refused = None
    except ProtocolError as exc:
        count, refused = None, exc
    if header is not None:
        if refused is not None:
            raise InvariantBroken(f"the header check refused a request the codec decodes: {refused}")
        decoded = len(header._unknown_tagged) + len(header._present_tags) if flexible else 0
        if count != decoded:
            raise InvariantBroken(f"the header check counts {count} tagged fields, the codec {decoded}")
    if refused is None and refusal is not None and refusal.reason.startswith("request header:") \
            and LIMIT in refusal.reason:
        raise InvariantBroken(f"the header check passed a header the codec refuses for its count: {refusal}")
    if _EVERY_REQUEST_NATIVE is None or not (0 <= api_key < NATIVE_KEYS and 0 <= version < NATIVE_VERSIONS):
        return
    peeked = SIZE_PREFIX.pack(len(frame)) + frame
    carried = _cpump.classify(peeked, _EVERY_REQUEST_NATIVE, DEFAULT_MAX_FRAME_BYTES) != 0
    if not flexible:
        return
    try:
        accepted = check_request_header_tags(peeked[4:NATIVE_PEEK], True) is not None
    except ProtocolError:
        accepted = False
    if carried and not accepted:
        raise InvariantBroken("the native relay would carry a request whose header the check refuses")
    if api_key not in (ApiKey.PRODUCE, ApiKey.FETCH) and accepted and not carried and len(frame) >= 8:
        raise InvariantBroken("the native relay leaves to the event loop a request whose header the check accepts")


def _check_native_fetch(frame: bytes, version: int, body) -> None:
    """The native relay's reads of a Fetch request against their Python reference, and
    against the codec: nothing it carries holds what a feature acts on."""
    if _cpump is None:
        return
    peeked = SIZE_PREFIX.pack(len(frame)) + frame
    for guarded in (False, True):
        native = _cpump.fetch_request_plain(peeked, version, guarded, _GUARD, _KNOWN)
        python = native_checks.fetch_request_plain(peeked, version, guarded, _GUARD, _KNOWN)
        if native != python:
            raise InvariantBroken(f"the native relay reads a Fetch v{version} as {native}, its reference as {python}")
        table = _FETCH_NATIVE[guarded]
        native = _cpump.classify(peeked, table, DEFAULT_MAX_FRAME_BYTES, _GUARD, _KNOWN)
        python = native_checks.classify_fetch(peeked, table, DEFAULT_MAX_FRAME_BYTES, _GUARD, _KNOWN)
        if native != python:
            raise InvariantBroken(f"the native relay classes a Fetch v{version} {native}, its reference {python}")
        if not native or body is None:
            continue
        partitions = [p for topic in body.topics for p in topic.partitions]
        if body.key_ranges is not None or any(p.key_ranges is not None or p.cooperative is not None
                                              for p in partitions):
            raise InvariantBroken(f"the native relay would carry a Fetch v{version} with an extension")
        names = [t.topic for t in [*body.topics, *(body.forgotten_topics_data or ())]]
        if guarded and version < FETCH_FIRST_TOPIC_ID and any(names_suffix(n.encode(), b".kr") for n in names):
            raise InvariantBroken(f"the native relay would carry a Fetch v{version} naming a virtual topic")


_ANSWERS = _cpump is not None and hasattr(_cpump, "Answers")
_SERVED = b"".join(served_entry(uuid.UUID(bytes=_KNOWN[i:i + 16]), p) for i in range(0, len(_KNOWN), 16)
                   for p in range(4))


def _check_native_answer(frame: bytes, version: int, body) -> None:
    """The loop's read of a key-range Fetch it may answer against its Python reference, and
    against the codec and the event loop: the keys it looks up are the cache's for what the
    codec decodes, and with those shares cached, its answer is the event loop's, byte for
    byte."""
    if not _ANSWERS:
        return
    peeked = SIZE_PREFIX.pack(len(frame)) + frame
    served = _SERVED
    if body is not None and version >= FETCH_FIRST_TOPIC_ID:
        served += b"".join(served_entry(t.topic_id, p.partition) for t in body.topics for p in t.partitions)
    for guarded in (False, True):
        native = _cpump.answer_keys(peeked, guarded, served, _GUARD, _KNOWN)
        python = native_checks.answer_keys(peeked, guarded, served, _GUARD, _KNOWN)
        if native != python:
            raise InvariantBroken(f"the native relay reads a Fetch v{version} for an answer as {native}, "
                                  f"its reference as {python}")
    keys = _cpump.answer_keys(peeked, False, served)
    if not isinstance(keys, list):
        return
    if body is None:
        raise InvariantBroken(f"the native relay would answer a Fetch v{version} the codec refuses")
    ranges = FetchRangeSessions().resolve(body)
    if ranges.invalid:
        return  # ranges the cache never holds: no answer is ever published for them
    chosen = [ranges.filtered.get((topic_key(t), p.partition)) for t in body.topics for p in t.partitions]
    if any(c is None for c in chosen):
        raise InvariantBroken(f"the native relay would answer a Fetch v{version} with a partition the cache never "
                              "holds a share of")
    wanted = [answer_key(t.topic_id, p.partition, body.isolation_level, p.fetch_offset, c)
              for (t, p), c in zip([(t, p) for t in body.topics for p in t.partitions], chosen)]
    if keys != wanted:
        raise InvariantBroken(f"the native relay looks a Fetch v{version} up as {keys}, the cache as {wanted}")
    if any(t.topic_id.int == 0 for t in body.topics):
        return  # a topic by the zero id is looked up by name: the cache publishes no share of it
    # Those shares cached and published: the loop's answer is the event loop's.
    names = {t.topic_id: f"topic-{t.topic_id}" for t in body.topics}
    engine = KeyRangeEngine(cache_bytes=1 << 30, topic_settings=lambda name: _TOPIC_SETTINGS, topic_name=names.get)
    ids = {name: topic_id for topic_id, name in names.items()}
    native = NativeShares(_cpump.Answers(), engine.cache, topic_id=ids.get, topic_settings=engine.topic_settings,
                          reads_ahead=False, in_flight=lambda key: False)
    engine.cache.listener = native
    conn = ConnectionRanges()
    for n, topic in enumerate(body.topics):
        for partition in topic.partitions:
            pk = (topic.topic_id, partition.partition)
            conn.served.add((names[topic.topic_id], partition.partition))
            conn.served_ids.add(served_entry(*pk))
            engine.cache.put(CachedShare((names[topic.topic_id], partition.partition), ranges.filtered[pk],
                                         partition.fetch_offset, partition.fetch_offset + 1 + n,
                                         body.isolation_level, records=frame[:n * 7], high_watermark=n,
                                         last_stable_offset=-n, log_start_offset=partition.partition,
                                         aborted_transactions=[FetchResponseBody.AbortedTransaction(
                                             producer_id=n, first_offset=-1)] * (n % 3)))
    answer = _cpump.answer(peeked, native.table, conn.served_blob())
    # A share above its partition's limit is served in parts, by the event loop alone.
    fits = all(len(frame[:n * 7]) <= partition.partition_max_bytes
               for n, topic in enumerate(body.topics) for partition in topic.partitions)
    if not fits:
        if answer is not None:
            raise InvariantBroken(f"the native relay answers a Fetch v{version} with a share above its limit")
        return
    if answer is None:
        raise InvariantBroken(f"the native relay does not answer a Fetch v{version} whose shares are cached")
    header, again = messages.decode_request(frame)
    plan = engine.plan(conn, version, again, 0.0)
    if plan is None:
        raise InvariantBroken(f"the native relay answers a Fetch v{version} the event loop forwards")
    engine.upstream_reads(plan)
    engine.finish(plan)
    if plan.upstream_body is not None:
        raise InvariantBroken(f"the native relay answers a Fetch v{version} the event loop reads the broker for")
    encoded = messages.encode_response(ApiKey.FETCH, version, messages.new_response_header(header.correlation_id),
                                       engine.complete(conn, plan, None, 0.0))
    if answer != SIZE_PREFIX.pack(len(encoded)) + encoded:
        raise InvariantBroken(f"the native relay's answer to a Fetch v{version} is not the event loop's")


def _check_request(frame: bytes) -> None:
    try:
        peek = peek_request_header(frame)
    except ProtocolError:
        return
    refusal: ProtocolError | None = None
    try:
        header, body = messages.decode_request(frame)
    except UnsupportedVersionError as exc:
        header = body = None
        refusal = exc
    except ProtocolError as exc:
        check_not_internal(exc)
        header = body = None
        refusal = exc
    if header is not None and (peek.api_key, peek.api_version, peek.correlation_id, peek.client_id) != \
            (header.request_api_key, header.request_api_version, header.correlation_id, header.client_id):
        raise InvariantBroken(f"header peek {peek} differs from the decoded header {header}")
    _check_header_tags(frame, peek.api_key, peek.api_version, header, refusal)
    if peek.api_key == ApiKey.FETCH:
        _check_native_fetch(frame, peek.api_version, body)
        _check_native_answer(frame, peek.api_version, body)
    if peek.api_key != ApiKey.PRODUCE:
        return
    try:
        acks = produce_acks(frame, peek)
    except ProtocolError:
        if body is not None:
            raise InvariantBroken("produce_acks refused a Produce request the codec decodes") from None
        return
    if body is not None and acks != body.acks:
        raise InvariantBroken(f"produce_acks read {acks}, the codec {body.acks}")
    if _cpump is not None:
        native = _cpump.produce_acks(SIZE_PREFIX.pack(len(frame)) + frame, peek.api_version)
        if native != acks:
            raise InvariantBroken(f"the native relay read acks {native}, the Python peek {acks}")


def _check_produce_response(frame: bytes, version: int) -> None:
    """The native relay passes a Produce response on untouched only if it has no leader
    hints for the proxy to rewrite. Like every response no feature decodes, it does not
    judge bytes it has no use for (a topic name's UTF-8, the order of tags): those the
    codec refuses may pass too, untouched, but never with a broker's address in them."""
    if _cpump is None or _cpump.produce_response_needs_python(frame, version):
        return
    try:
        _, body = messages.decode_response(ApiKey.PRODUCE, version, frame)
    except ProtocolError as exc:
        check_not_internal(exc)
        if LIMIT in exc.reason:
            raise InvariantBroken(f"the native relay would pass on a Produce v{version} response the codec "
                                  f"refuses for its counts: {exc}") from None
        return
    if body.node_endpoints:
        raise InvariantBroken(f"the native relay would pass on a Produce v{version} response with leader hints")


def _walk_streaming(frame: bytes, version: int, sizes: tuple[int, int]) -> int:
    size = len(frame)
    guarded = _Guarded(frame, min(size, sizes[1] * 37))
    walk = walk_fetch_response(guarded, size, version, guarded.filled)
    turn = 0
    try:
        need, safe = next(walk)
        while True:
            if need <= guarded.filled:
                raise InvariantBroken(f"the Fetch walk waited for byte {need} with {guarded.filled} received")
            guarded.floor = max(guarded.floor, min(need, safe))
            guarded.filled = min(size, need + (sizes[turn % 2] - 1) * 5)
            turn += 1
            need, safe = walk.send(guarded.filled)
    except StopIteration as done:
        return done.value


def _check_fetch_response(frame: bytes, version: int, sizes: tuple[int, int], book: _Book) -> None:
    try:
        peek_correlation_id(frame)
    except ProtocolError:
        return
    try:
        tail = fetch_response_tail(frame, version)
    except ProtocolError:
        tail = None
    try:
        streamed: int | None = _walk_streaming(frame, version, sizes)
    except ProtocolError:
        streamed = None
    if streamed != tail:
        raise InvariantBroken(f"streaming walk found the tail at {streamed}, the complete walk at {tail}")
    if _cpump is not None:
        native = _cpump.fetch_response_tail(frame, version, sizes[0])
        if native != tail:
            raise InvariantBroken(f"the native relay's walk found the tail at {native}, the Python walk at {tail}")
    if tail is None:
        try:
            messages.decode_response(ApiKey.FETCH, version, frame)
        except ProtocolError as exc:
            check_not_internal(exc)
            return
        raise InvariantBroken(f"the walk refused a Fetch v{version} response the codec decodes")
    if version < FETCH_FIRST_NODE_ENDPOINTS:
        return
    try:
        has_tag(frame, tail, NODE_ENDPOINTS_TAG)
        rewritten = rewrite_fetch_tail(frame, tail, version, book)
    except ProtocolError as exc:
        check_not_internal(exc)
        return
    if len(rewritten) != len(frame) - tail:
        raise InvariantBroken(f"the tail rewrite made {len(frame) - tail} bytes into {len(rewritten)}")


def one_input(data: bytes) -> None:
    choices = Choices(data)
    control = choices.byte()
    limit = FRAME_LIMITS[control & 3]
    version = FIRST_FLEXIBLE_FETCH + ((control >> 2) & 7) % FETCH_VERSIONS
    produce_version = FIRST_HINTED_PRODUCE + ((control >> 5) & 3)
    sizes = _chunk_sizes(choices, len(data))
    book = _Book(sizes[0] * 2 if control & 0x80 else 9)
    frames = _check_splitting(choices.rest(), limit, sizes)
    for frame in frames[:MAX_FRAMES]:
        _check_request(frame)
        _check_fetch_response(frame, version, sizes, book)
        _check_produce_response(frame, produce_version)
