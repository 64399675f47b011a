/*
 * The native relay: one loop over a client's socket and its broker connection's socket
 * that moves runs of frames no feature reads without entering the interpreter.
 *
 * Why: every frame the event loop handles costs 100-180 us of Python and scheduler work
 * (a Produce request of 256 KB: about 180 us for a dozen system calls), which is most of
 * what the proxy spends beyond a bare relay. Here a frame costs its system calls and a few
 * comparisons, and it runs on a worker thread with the GIL released, so the event loop
 * keeps serving every other connection on the other core.
 *
 * The contract with proxy/net/native_relay.py:
 *
 * - It is entered only at frame boundaries on both sockets, with both splice pipes empty
 *   and no request of the event loop's in flight. It carries on the requests of an earlier
 *   run still in flight (``flights``), in order.
 * - It reads a request only after peeking at its header (MSG_PEEK) and finding its API
 *   key and version marked in ``classes``: 1 relays the response untouched, 2 (Produce)
 *   reads the response whole and relays it untouched when it carries no top-level tagged
 *   fields (the broker's leader hints, which the proxy must rewrite). The bit
 *   CLASS_FLEXIBLE_HEADER on top says the request's header is flexible (v2): its
 *   tagged-field count, after the client id, must then be readable in the peeked bytes
 *   and within MAX_TAGGED_FIELDS (proxy/protocol/constants.py: older brokers allocate by
 *   it), or the event loop reads the request and refuses it. A request marked 0, a
 *   Produce with acks=0, an oversized or malformed header, or the client's end of stream
 *   stays in the socket: the run stops and the event loop reads it.
 * - A Produce marked CLASS_GUARDED as well (virtual topics are on: a Produce naming one is
 *   refused by the event loop) is carried only when the peeked bytes show every topic it
 *   names, and none is virtual: no name holds a suffix of ``guard`` followed by a digit 1-9,
 *   no topic id is one of ``guard``'s (the ids the proxy handed out for virtual topics).
 *   A request whose names do not all fit in the peek (several topics, the first with its
 *   records) is the event loop's.
 * - A Fetch is carried only when all of it is in the peek (up to FETCH_PEEK_MAX bytes), it
 *   parses to its last byte, and its body holds no tagged field (the key-range and
 *   cooperative extensions are tagged fields; a consumer sends none); marked CLASS_GUARDED,
 *   only when no topic it names (Topics and ForgottenTopicsData) may be virtual by the
 *   guard and, by id (v13+), each is one of ``known`` (the topics the proxy knows). Its
 *   response (class 3, CLASS_FETCH: v16+, whose top-level tagged fields may hold leader
 *   hints) is walked as it arrives, as proxy/protocol/peek.py's walk_fetch_response walks
 *   it: the loop peeks at the structure between record sets and splices everything, and
 *   passes the response on untouched to its end when its top-level tagged fields are
 *   empty; otherwise, with everything before them sent, it reads them and hands them
 *   back (size prefix and correlation id first), and the event loop sends them rewritten
 *   in as many bytes.
 * - A key-range Fetch (tagged KeyRanges) whose every partition's answer is in ``answers``
 *   (a table the event loop fills with cached shares; see "answers from the key-range
 *   cache" below) is answered by the loop itself when the table carries Fetches of its
 *   version, after the responses still owed (responses keep request order): the request is
 *   taken from the socket, its answers out of the table, and the response is written from
 *   their bytes (the records from the share's own buffer). The run hands back the handles
 *   of what it took, for the event loop's bookkeeping.
 * - It stops only at frame boundaries (except when aborted): at the end of its time slice,
 *   after ``idle_ms`` with nothing to do, when woken through ``wake_fd`` (an eventfd: a
 *   total of 1 asks for a stop at the boundaries, 2 or more aborts at once), and at the
 *   first response that needs the interpreter (returned whole, with its request first in
 *   the flights handed back). Requests whose response has not begun are handed back.
 * - Bytes are spliced from socket to pipe to socket and never enter user space, except a
 *   response's first 8 bytes (size and correlation id, checked against its request), the
 *   Produce responses it must look into, and the structure of a Fetch response it peeks at.
 *
 * It holds no Python object while the GIL is released; what it returns is built after.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* The table's dimensions and classes (KEYS, VERSIONS, CLASS_*: CLASS_FLEXIBLE_HEADER is a flag
 * on a class, the request header is v2) and the most a message may declare
 * (MAX_ARRAY_ELEMENTS, MAX_TAGGED_FIELDS: Kafka 4.4's readers' limits), written by setup.py
 * from proxy/net/native_table.py and proxy/protocol/constants.py, where they are declared. */
#include "_native_table.h"
#define API_PRODUCE 0
#define API_FETCH 1
#define PEEK_MAX 1024
#define FETCH_PEEK_MAX 16384 /* a Fetch is read whole from the peek: 480 partitions of a full fetch */
#define FETCH_FIRST_FLEXIBLE 12
#define FETCH_FIRST_TOPIC_ID 13
#define FETCH_LAST_REPLICA_ID 14
#define WALK_WINDOW 4096 /* how far a Fetch response's walk peeks ahead of its position */
#define TOPIC_ID_BYTES 16
#define DONE_MAX 65536
#define SPLICED_MIN 65536 /* the event loop splices requests from this size on: count them alike */

enum reason {
    R_NONE = -1,
    R_SLICE = 0,
    R_IDLE = 1,
    R_PYTHON_REQUEST = 2,
    R_PYTHON_RESPONSE = 3,
    R_WOKEN = 4,
    R_ABORTED = 5,
    R_UPSTREAM_CLOSED = 6,
    R_PROTOCOL = 7,
    R_BROKEN = 8,
};

typedef struct {
    int16_t api_key, version;
    int32_t correlation_id;
    int cls;
    int64_t request_bytes;
    int64_t start_ns;
} flight_t;

typedef struct {
    int16_t api_key;
    int64_t request_bytes, response_bytes, latency_ns;
} done_t;

/* Bytes moved from one socket to another through a pipe; ``remaining`` still to take from
 * the source, ``held`` in the pipe. */
typedef struct {
    int src, dst, pipe_r, pipe_w;
    int64_t capacity, held, remaining;
} mover_t;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline uint32_t be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline int16_t be16(const uint8_t *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }

/* ------------------------------------------------------------------ header reads
 * Bounds-checked readers over [p, end): each returns the new position, or NULL when the
 * field runs past the end, or holds a count over the limits. */

static const uint8_t *read_uvarint(const uint8_t *p, const uint8_t *end, uint32_t *value)
{
    uint32_t v = 0;
    for (int shift = 0; shift <= 28; shift += 7) {
        if (p >= end)
            return NULL;
        uint8_t b = *p++;
        if (shift == 28 && b > 0x0f) /* more than 32 bits: malformed, as the codecs say */
            return NULL;
        v |= (uint32_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *value = v;
            return p;
        }
    }
    return NULL;
}

static const uint8_t *skip(const uint8_t *p, const uint8_t *end, uint64_t n)
{
    if (p == NULL || (uint64_t)(end - p) < n)
        return NULL;
    return p + n;
}

static const uint8_t *skip_tagged(const uint8_t *p, const uint8_t *end, uint32_t *count)
{
    uint32_t n, tag, size;
    if (p == NULL || (p = read_uvarint(p, end, &n)) == NULL || n > MAX_TAGGED_FIELDS)
        return NULL;
    if (count)
        *count = n;
    for (uint32_t i = 0; i < n; i++) {
        if ((p = read_uvarint(p, end, &tag)) == NULL || (p = read_uvarint(p, end, &size)) == NULL)
            return NULL;
        if ((p = skip(p, end, size)) == NULL)
            return NULL;
    }
    return p;
}

/* A compact array's length (elements + 1; 0 for null), NULL above MAX_ARRAY_ELEMENTS. */
static const uint8_t *read_array_length(const uint8_t *p, const uint8_t *end, uint32_t *length)
{
    if (p == NULL || (p = read_uvarint(p, end, length)) == NULL || *length > (uint32_t)MAX_ARRAY_ELEMENTS + 1)
        return NULL;
    return p;
}

/* The tagged-field count of a flexible request header whose frame (from its size prefix)
 * starts at ``frame``: -1 when the peeked bytes end first, -2 when it is over
 * MAX_TAGGED_FIELDS or not a canonical varint of at most 32 bits (what
 * proxy/protocol/framing.py's check_request_header_tags refuses). */
static int64_t header_tag_count(const uint8_t *frame, const uint8_t *end)
{
    const uint8_t *p = frame + 12; /* size, api key, version, correlation id */
    if (end - p < 2)
        return -1;
    int16_t client_len = be16(p);
    p += 2;
    if (client_len < -1)
        return -2;
    if (client_len > 0 && (p = skip(p, end, (uint64_t)client_len)) == NULL)
        return -1;
    uint32_t v = 0;
    for (int shift = 0; shift <= 28; shift += 7) {
        if (p >= end)
            return -1;
        uint8_t b = *p++;
        if (shift == 28 && b > 0x0f)
            return -2;
        v |= (uint32_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            if (b == 0 && shift > 0) /* a redundant zero byte */
                return -2;
            return v > MAX_TAGGED_FIELDS ? -2 : (int64_t)v;
        }
    }
    return -2;
}

static const uint8_t *skip_compact_string(const uint8_t *p, const uint8_t *end)
{
    uint32_t n;
    if (p == NULL || (p = read_uvarint(p, end, &n)) == NULL)
        return NULL;
    return n ? skip(p, end, n - 1) : p;
}

/* The acks of a Produce request whose frame (from its size prefix) starts at ``frame``;
 * -1000 when the peeked bytes end first. */
static int produce_acks(const uint8_t *frame, const uint8_t *end, int version)
{
    const uint8_t *p = frame + 12; /* size, api key, version, correlation id */
    if (end - p < 2)
        return -1000;
    int16_t client_len = be16(p);
    p += 2;
    if (client_len > 0 && (p = skip(p, end, (uint64_t)client_len)) == NULL)
        return -1000;
    if (version >= 9) {
        if ((p = skip_tagged(p, end, NULL)) == NULL || (p = skip_compact_string(p, end)) == NULL)
            return -1000;
    } else if (version >= 3) {
        if (end - p < 2)
            return -1000;
        int16_t tx_len = be16(p);
        p += 2;
        if (tx_len > 0 && (p = skip(p, end, (uint64_t)tx_len)) == NULL)
            return -1000;
    }
    if (end - p < 2)
        return -1000;
    return be16(p);
}

/* Whether a Produce response (``body``: after its size prefix) must go through the
 * interpreter: 0 when it is well formed and has no top-level tagged fields (nothing to
 * rewrite), 1 otherwise (leader hints to rewrite, or bytes the codec must judge). */
int produce_response_needs_python(const uint8_t *body, size_t size, int version)
{
    const uint8_t *end = body + size;
    const uint8_t *p = skip(body, end, 4); /* correlation id */
    uint32_t topics, partitions, errors, tags;
    if (version < 9)
        return 1;
    if ((p = skip_tagged(p, end, NULL)) == NULL || (p = read_array_length(p, end, &topics)) == NULL)
        return 1;
    for (uint32_t t = 1; t < topics; t++) {
        p = version >= 13 ? skip(p, end, 16) : skip_compact_string(p, end);
        if (p == NULL || (p = read_array_length(p, end, &partitions)) == NULL)
            return 1;
        for (uint32_t i = 1; i < partitions; i++) {
            /* index, error code, base offset, log append time, log start offset */
            if ((p = skip(p, end, 4 + 2 + 8 + 8 + 8)) == NULL || (p = read_array_length(p, end, &errors)) == NULL)
                return 1;
            for (uint32_t e = 1; e < errors; e++) {
                p = skip_tagged(skip_compact_string(skip(p, end, 4), end), end, NULL);
                if (p == NULL)
                    return 1;
            }
            if ((p = skip_tagged(skip_compact_string(p, end), end, NULL)) == NULL)
                return 1;
        }
        if ((p = skip_tagged(p, end, NULL)) == NULL)
            return 1;
    }
    if ((p = skip_tagged(skip(p, end, 4), end, &tags)) == NULL)
        return 1;
    return tags != 0 || p != end;
}

/* ------------------------------------------------------------------ the virtual-topic guard
 * ``guard`` (proxy/net/native_table.py's guard_blob): a byte S, then S suffixes, each a byte
 * of length and its bytes, then 16-byte topic ids in ascending byte order. */

typedef struct {
    const uint8_t *blob;
    size_t len;
    const uint8_t *known; /* Fetch: the ids of the topics the proxy knows, 16 bytes each, ascending */
    size_t known_len;
} guard_t;

/* Whether ``id`` is one of the ``len`` bytes of sorted 16-byte ids at ``ids`` (by halves). */
static int ids_hold(const uint8_t *ids, size_t len, const uint8_t *id)
{
    size_t low = 0, high = len / TOPIC_ID_BYTES;
    while (low < high) {
        size_t middle = (low + high) / 2;
        int order = memcmp(ids + middle * TOPIC_ID_BYTES, id, TOPIC_ID_BYTES);
        if (order == 0)
            return 1;
        if (order < 0)
            low = middle + 1;
        else
            high = middle;
    }
    return 0;
}

/* Whether ``name`` holds one of the guard's suffixes followed by a digit 1-9 (what a virtual
 * topic's name ends with: K >= 2 has no leading zero). Says yes for some real names, never
 * no for a virtual one. A guard that does not parse says yes to everything. */
static int name_may_be_virtual(const uint8_t *name, size_t length, const guard_t *guard)
{
    if (guard->len == 0)
        return 1;
    const uint8_t *g = guard->blob, *g_end = guard->blob + guard->len;
    unsigned suffixes = *g++;
    for (unsigned i = 0; i < suffixes; i++) {
        if (g >= g_end)
            return 1;
        size_t suffix_len = *g++;
        if (suffix_len == 0 || (size_t)(g_end - g) < suffix_len)
            return 1;
        const uint8_t *from = name, *name_end = name + length;
        while ((size_t)(name_end - from) > suffix_len) {
            const uint8_t *at = memmem(from, (size_t)(name_end - from), g, suffix_len);
            if (at == NULL || (size_t)(name_end - at) <= suffix_len)
                break;
            uint8_t digit = at[suffix_len];
            if (digit >= '1' && digit <= '9')
                return 1;
            from = at + 1;
        }
        g += suffix_len;
    }
    return 0;
}

/* Whether ``id`` is one of the guard's ids (sorted: a binary search). */
static int id_is_virtual(const uint8_t *id, const guard_t *guard)
{
    if (guard->len == 0)
        return 1;
    const uint8_t *g = guard->blob, *g_end = guard->blob + guard->len;
    unsigned suffixes = *g++;
    for (unsigned i = 0; i < suffixes && g < g_end; i++)
        g += 1 + *g;
    if (g > g_end || (g_end - g) % TOPIC_ID_BYTES)
        return 1;
    return ids_hold(g, (size_t)(g_end - g), id);
}

/* Whether a Fetch may name topic ``id`` without the event loop: it is one of the topics the
 * proxy knows (the guard's ``known``), and not a virtual one. */
static int id_is_plain(const uint8_t *id, const guard_t *guard)
{
    if (guard->known_len % TOPIC_ID_BYTES)
        return 0;
    return ids_hold(guard->known, guard->known_len, id) && !id_is_virtual(id, guard);
}

/* A count of a Produce request's array: compact (elements + 1) from v9, int32 before.
 * NULL when it runs past ``end``, is null, or is over MAX_ARRAY_ELEMENTS. */
static const uint8_t *read_count(const uint8_t *p, const uint8_t *end, int flexible, uint32_t *count)
{
    if (p == NULL)
        return NULL;
    if (flexible) {
        uint32_t length;
        if ((p = read_array_length(p, end, &length)) == NULL || length == 0)
            return NULL;
        *count = length - 1;
        return p;
    }
    if (end - p < 4)
        return NULL;
    int32_t n = (int32_t)be32(p);
    if (n < 0 || n > MAX_ARRAY_ELEMENTS)
        return NULL;
    *count = (uint32_t)n;
    return p + 4;
}

/* Whether a Produce request (``frame``: from its size prefix, peeked up to ``end``) may name
 * a virtual topic: 0 when every topic it names is in these bytes and none may be virtual;
 * 1 when one may; -1 when these bytes end before its last topic's name, or do not parse. */
static int produce_names_virtual(const uint8_t *frame, const uint8_t *end, int version, const guard_t *guard)
{
    const int flexible = version >= 9;
    const uint8_t *p = frame + 12; /* size, api key, version, correlation id */
    if (end - p < 2)
        return -1;
    int16_t client_len = be16(p);
    p += 2;
    if (client_len > 0 && (p = skip(p, end, (uint64_t)client_len)) == NULL)
        return -1;
    if (flexible) {
        if ((p = skip_compact_string(skip_tagged(p, end, NULL), end)) == NULL) /* header tags, transactional id */
            return -1;
    } else if (version >= 3) {
        if (end - p < 2)
            return -1;
        int16_t tx_len = be16(p);
        p += 2;
        if (tx_len > 0 && (p = skip(p, end, (uint64_t)tx_len)) == NULL)
            return -1;
    }
    uint32_t topics, partitions;
    if ((p = read_count(skip(p, end, 2 + 4), end, flexible, &topics)) == NULL) /* acks, timeout */
        return -1;
    for (uint32_t t = 0; t < topics; t++) {
        if (version >= 13) {
            if ((size_t)(end - p) < TOPIC_ID_BYTES)
                return -1;
            if (id_is_virtual(p, guard))
                return 1;
            p += TOPIC_ID_BYTES;
        } else {
            uint64_t length;
            if (flexible) {
                uint32_t n;
                if ((p = read_uvarint(p, end, &n)) == NULL || n == 0)
                    return -1;
                length = n - 1;
            } else {
                if (end - p < 2 || be16(p) < 0)
                    return -1;
                length = (uint64_t)be16(p);
                p += 2;
            }
            if ((uint64_t)(end - p) < length)
                return -1;
            if (name_may_be_virtual(p, (size_t)length, guard))
                return 1;
            p += length;
        }
        if (t + 1 == topics)
            return 0; /* the last name: its partitions need not be read */
        if ((p = read_count(p, end, flexible, &partitions)) == NULL)
            return -1;
        for (uint32_t i = 0; i < partitions; i++) {
            if ((p = skip(p, end, 4)) == NULL) /* partition index */
                return -1;
            if (flexible) {
                uint32_t n;
                if ((p = read_uvarint(p, end, &n)) == NULL)
                    return -1;
                if (n > 0 && (p = skip(p, end, n - 1)) == NULL)
                    return -1;
                if ((p = skip_tagged(p, end, NULL)) == NULL)
                    return -1;
            } else {
                if (end - p < 4)
                    return -1;
                int32_t n = (int32_t)be32(p);
                p += 4;
                if (n > 0 && (p = skip(p, end, (uint64_t)n)) == NULL)
                    return -1;
            }
        }
        if (flexible && (p = skip_tagged(p, end, NULL)) == NULL)
            return -1;
    }
    return 0; /* no topics: nothing to refuse */
}

/* ------------------------------------------------------------------ Fetch requests
 * Whole in the peek, read to their last byte: every tagged-field section of the body must
 * be empty (the extensions the features read are tagged fields), and with the guard on,
 * every topic named must clear it. proxy/net/native_checks.py is the same read in Python. */

/* A canonical unsigned varint (as the codec reads one: at most 32 bits, no redundant zero
 * byte); NULL when it is not, or runs past ``end``. */
static const uint8_t *read_canonical(const uint8_t *p, const uint8_t *end, uint32_t *value)
{
    const uint8_t *start = p;
    if (p == NULL || (p = read_uvarint(p, end, value)) == NULL)
        return NULL;
    return p - start > 1 && p[-1] == 0 ? NULL : p;
}

/* A count of a Fetch request's array: compact (elements + 1) from v12, int32 before. NULL
 * when it runs past ``end``, is null, or is over MAX_ARRAY_ELEMENTS. */
static const uint8_t *fetch_count(const uint8_t *p, const uint8_t *end, int flexible, uint32_t *count)
{
    if (p == NULL)
        return NULL;
    if (flexible) {
        uint32_t length;
        if ((p = read_canonical(p, end, &length)) == NULL || length == 0 || length - 1 > MAX_ARRAY_ELEMENTS)
            return NULL;
        *count = length - 1;
        return p;
    }
    if (end - p < 4)
        return NULL;
    int32_t n = (int32_t)be32(p);
    if (n < 0 || n > MAX_ARRAY_ELEMENTS)
        return NULL;
    *count = (uint32_t)n;
    return p + 4;
}

/* A string (compact from v12, int16-prefixed before), not null; ``*at``/``*length`` its bytes. */
static const uint8_t *fetch_string(const uint8_t *p, const uint8_t *end, int flexible, const uint8_t **at,
                                   uint64_t *length)
{
    if (p == NULL)
        return NULL;
    if (flexible) {
        uint32_t n;
        if ((p = read_canonical(p, end, &n)) == NULL || n == 0)
            return NULL;
        *length = n - 1;
    } else {
        if (end - p < 2 || be16(p) < 0)
            return NULL;
        *length = (uint64_t)be16(p);
        p += 2;
    }
    *at = p;
    return skip(p, end, *length);
}

/* A tagged-field section (``p``: at its count) that must be empty. NULL when it does not
 * parse; *plain set to 0 when it holds a field. */
static const uint8_t *fetch_no_tags(const uint8_t *p, const uint8_t *end, int *plain)
{
    uint32_t count;
    if ((p = read_canonical(p, end, &count)) == NULL || count > MAX_TAGGED_FIELDS)
        return NULL;
    if (count)
        *plain = 0;
    return p;
}

/* A topic a Fetch names, by id (v13+) or name: NULL when it does not parse; *plain set to 0
 * when ``guarded`` and it may be virtual, or by id is not one the proxy knows. */
static const uint8_t *fetch_topic(const uint8_t *p, const uint8_t *end, int version, int guarded,
                                  const guard_t *guard, int *plain)
{
    if (p == NULL)
        return NULL;
    if (version >= FETCH_FIRST_TOPIC_ID) {
        if (end - p < TOPIC_ID_BYTES)
            return NULL;
        if (guarded && !id_is_plain(p, guard))
            *plain = 0;
        return p + TOPIC_ID_BYTES;
    }
    const uint8_t *name;
    uint64_t length;
    if ((p = fetch_string(p, end, version >= FETCH_FIRST_FLEXIBLE, &name, &length)) == NULL)
        return NULL;
    if (guarded && name_may_be_virtual(name, (size_t)length, guard))
        *plain = 0;
    return p;
}

/* ``p`` past a request header's client id and (``flexible``) its tagged fields, whose
 * contents no feature of the loop reads; NULL when the bytes end first or a count is beyond
 * the limits. */
static const uint8_t *skip_header_rest(const uint8_t *p, const uint8_t *end, int flexible)
{
    if (end - p < 2)
        return NULL;
    int16_t client_len = be16(p);
    p += 2;
    if (client_len < -1 || (client_len > 0 && (p = skip(p, end, (uint64_t)client_len)) == NULL))
        return NULL;
    if (flexible) {
        uint32_t count, tag, length;
        if ((p = read_canonical(p, end, &count)) == NULL || count > MAX_TAGGED_FIELDS)
            return NULL;
        for (uint32_t i = 0; i < count; i++) {
            p = read_canonical(read_canonical(p, end, &tag), end, &length);
            if ((p = skip(p, end, length)) == NULL)
                return NULL;
        }
    }
    return p;
}

/* Whether the loop may carry a Fetch request (``frame``: from its size prefix, peeked up to
 * ``end``): 0 when all of it is in these bytes, it parses to its last byte with every count
 * within the limits, no tagged-field section of its body (top level, topics, partitions,
 * forgotten topics) holds a field, and (``guarded``) no topic it names, in Topics or
 * ForgottenTopicsData, may be virtual or, by id, is unknown to the proxy. 1 at the first
 * field or topic that makes it the event loop's; -1 when these bytes end first or do not
 * parse. Read in order, so that the answer is the same whatever follows that point. */
static int fetch_request_plain(const uint8_t *frame, const uint8_t *end, int version, int guarded,
                               const guard_t *guard)
{
    const int flexible = version >= FETCH_FIRST_FLEXIBLE;
    int64_t size = (int32_t)be32(frame);
    if (size < 8 || end - frame < size + 4)
        return -1;
    end = frame + 4 + size;
    /* size, api key, version, correlation id; the header's tagged fields: the features read the body's */
    const uint8_t *p = skip_header_rest(frame + 12, end, flexible);
    if (p == NULL)
        return -1;
    /* replica id (to v14), max wait, min bytes, max bytes (v3+), isolation level (v4+),
     * session id and epoch (v7+) */
    p = skip(p, end, (uint64_t)((version <= FETCH_LAST_REPLICA_ID ? 4 : 0) + 4 + 4 + (version >= 3 ? 4 : 0) +
                                (version >= 4 ? 1 : 0) + (version >= 7 ? 8 : 0)));
    /* partition, current leader epoch (v9+), fetch offset, last fetched epoch (v12+), log
     * start offset (v5+), partition max bytes */
    const uint64_t partition_bytes = 4 + (version >= 9 ? 4 : 0) + 8 + (version >= 12 ? 4 : 0) + (version >= 5 ? 8 : 0) + 4;
    uint32_t topics, partitions;
    int plain = 1;
    if ((p = fetch_count(p, end, flexible, &topics)) == NULL)
        return -1;
    for (uint32_t t = 0; t < topics; t++) {
        if ((p = fetch_topic(p, end, version, guarded, guard, &plain)) == NULL)
            return -1;
        if (!plain)
            return 1;
        if ((p = fetch_count(p, end, flexible, &partitions)) == NULL)
            return -1;
        for (uint32_t i = 0; i < partitions; i++) {
            if ((p = skip(p, end, partition_bytes)) == NULL)
                return -1;
            if (flexible && (p = fetch_no_tags(p, end, &plain)) == NULL)
                return -1;
            if (!plain)
                return 1;
        }
        if (flexible && (p = fetch_no_tags(p, end, &plain)) == NULL)
            return -1;
        if (!plain)
            return 1;
    }
    if (version >= 7) { /* forgotten topics: each a topic, its partitions (int32 each) */
        if ((p = fetch_count(p, end, flexible, &topics)) == NULL)
            return -1;
        for (uint32_t t = 0; t < topics; t++) {
            if ((p = fetch_topic(p, end, version, guarded, guard, &plain)) == NULL)
                return -1;
            if (!plain)
                return 1;
            if ((p = fetch_count(p, end, flexible, &partitions)) == NULL || (p = skip(p, end, 4 * (uint64_t)partitions)) == NULL)
                return -1;
            if (flexible && (p = fetch_no_tags(p, end, &plain)) == NULL)
                return -1;
            if (!plain)
                return 1;
        }
    }
    if (version >= 11) { /* rack id */
        const uint8_t *rack;
        uint64_t length;
        if ((p = fetch_string(p, end, flexible, &rack, &length)) == NULL)
            return -1;
    }
    if (flexible && (p = fetch_no_tags(p, end, &plain)) == NULL)
        return -1;
    if (!plain)
        return 1;
    return p == end ? 0 : -1;
}

/* How many bytes of a request the loop peeks at, from its first ``n``: a Fetch is read
 * whole (up to FETCH_PEEK_MAX; a larger one is the event loop's anyway), of any other
 * request the first PEEK_MAX bytes are enough. */
static ssize_t peek_span(const uint8_t *peek, ssize_t n)
{
    if (n < 12 || be16(peek + 4) != API_FETCH)
        return PEEK_MAX;
    int64_t whole = (int64_t)(int32_t)be32(peek) + 4;
    return whole > PEEK_MAX && whole <= FETCH_PEEK_MAX ? (ssize_t)whole : PEEK_MAX;
}

/* Peek at the client's next request into ``peek`` (FETCH_PEEK_MAX bytes): recv's answer. */
static ssize_t peek_request(int fd, uint8_t *peek)
{
    ssize_t n = recv(fd, peek, PEEK_MAX, MSG_PEEK | MSG_DONTWAIT);
    if (n == PEEK_MAX && peek_span(peek, n) > n)
        n = recv(fd, peek, (size_t)peek_span(peek, n), MSG_PEEK | MSG_DONTWAIT);
    return n;
}

/* How the loop may carry the request whose first ``n`` bytes (from its size prefix) are
 * ``peek``: CLASS_PYTHON when it may not, or cannot tell from these bytes (without the
 * CLASS_FLEXIBLE_HEADER and CLASS_GUARDED flags, which only the table holds). */
static int classify(const uint8_t *peek, ssize_t n, const uint8_t *classes, int64_t max_frame, const guard_t *guard)
{
    if (n < 12) /* its end, or a header still on its way: the event loop reads it */
        return CLASS_PYTHON;
    int64_t size = (int32_t)be32(peek);
    int api_key = be16(peek + 4), version = be16(peek + 6);
    if (size < 8 || size > max_frame || api_key < 0 || api_key >= KEYS || version < 0 || version >= VERSIONS)
        return CLASS_PYTHON;
    int entry = classes[api_key * VERSIONS + version];
    int cls = entry & CLASS_MASK;
    if (cls == CLASS_PYTHON)
        return CLASS_PYTHON;
    const uint8_t *end = peek + (n < size + 4 ? n : size + 4);
    /* A header declaring too many tagged fields, or whose count is not in these bytes, is
     * the event loop's: it refuses the one, and reads the other whole. */
    if ((entry & CLASS_FLEXIBLE_HEADER) && header_tag_count(peek, end) < 0)
        return CLASS_PYTHON;
    if (api_key == API_PRODUCE) {
        int acks = produce_acks(peek, end, version);
        if (acks == 0 || acks == -1000) /* no response to wait for, or unreadable here */
            return CLASS_PYTHON;
        if ((entry & CLASS_GUARDED) && produce_names_virtual(peek, end, version, guard) != 0)
            return CLASS_PYTHON; /* it may name a virtual topic, or its names are not all here */
    } else if (api_key == API_FETCH) {
        if (cls == CLASS_FETCH && version < FETCH_FIRST_FLEXIBLE) /* the walk reads flexible responses only */
            return CLASS_PYTHON;
        if (fetch_request_plain(peek, end, version, entry & CLASS_GUARDED, guard) != 0)
            return CLASS_PYTHON; /* an extension, maybe a virtual topic, or not all here */
    }
    return cls;
}

/* ------------------------------------------------------------------ Fetch responses
 * A Fetch response (v12+) walked as it arrives, as proxy/protocol/peek.py's
 * walk_fetch_response walks it, to where its top-level tagged fields begin: fixed fields,
 * names and record sets are stepped over by their sizes, and only the varints (counts,
 * lengths, tags) are read, from a peek at the socket. The same limits are refused. */

enum { FW_TAG_COUNT, FW_TAG, FW_TAG_SIZE, FW_TOPICS, FW_NAME, FW_PARTITIONS, FW_ABORTED, FW_RECORDS, FW_TAIL };
enum { AT_HEADER, AT_ABORTED, AT_PARTITION, AT_TOPIC }; /* whose tagged fields FW_TAG* walk */

typedef struct {
    int version;
    int state, level; /* the varint read next, and whose tagged fields are walked */
    uint32_t topics, partitions, aborted, tags; /* left at each level, the current one included */
    int64_t pos, size; /* body offsets (after the size prefix): walked to, and the end */
} fwalk_t;

static void fw_start(fwalk_t *w, int version, int64_t size)
{
    memset(w, 0, sizeof *w);
    w->version = version;
    w->size = size;
    w->pos = 4; /* the correlation id; the response header's tagged fields come next */
    w->state = FW_TAG_COUNT;
    w->level = AT_HEADER;
}

/* Step over ``n`` bytes: 0, or -1 past the end (the response ends inside a field). */
static int fw_skip(fwalk_t *w, int64_t n)
{
    w->pos += n;
    return w->pos <= w->size ? 0 : -1;
}

static int fw_tags(fwalk_t *w, int level)
{
    w->state = FW_TAG_COUNT;
    w->level = level;
    return 0;
}

static int fw_topic(fwalk_t *w)
{
    if (w->version < FETCH_FIRST_TOPIC_ID) {
        w->state = FW_NAME;
        return 0;
    }
    w->state = FW_PARTITIONS;
    return fw_skip(w, TOPIC_ID_BYTES);
}

static int fw_partition(fwalk_t *w)
{
    w->state = FW_ABORTED;
    return fw_skip(w, 4 + 2 + 8 + 8 + 8); /* index, error code, high watermark, last stable, log start */
}

static int fw_aborted(fwalk_t *w)
{
    if (w->aborted) {
        fw_tags(w, AT_ABORTED);
        return fw_skip(w, 8 + 8); /* producer id, first offset */
    }
    w->state = FW_RECORDS;
    return fw_skip(w, 4); /* preferred read replica */
}

/* On past a tagged-field section. */
static int fw_after_tags(fwalk_t *w)
{
    switch (w->level) {
    case AT_HEADER:
        w->state = FW_TOPICS;
        return fw_skip(w, 4 + 2 + 4); /* throttle time, error code, session id */
    case AT_ABORTED:
        w->aborted--;
        return fw_aborted(w);
    case AT_PARTITION:
        return --w->partitions ? fw_partition(w) : fw_tags(w, AT_TOPIC);
    default: /* AT_TOPIC */
        if (--w->topics)
            return fw_topic(w);
        w->state = FW_TAIL;
        return 0;
    }
}

/* Take the varint ``v`` the walk was at: 0, or -1 when the response is malformed. */
static int fw_value(fwalk_t *w, uint32_t v)
{
    uint32_t elements = v ? v - 1 : 0; /* of a compact array (0: null), or a length's bytes */
    int array = w->state == FW_TOPICS || w->state == FW_PARTITIONS || w->state == FW_ABORTED;
    if (array && elements > MAX_ARRAY_ELEMENTS)
        return -1;
    switch (w->state) {
    case FW_TAG_COUNT:
        if (v > MAX_TAGGED_FIELDS)
            return -1;
        w->tags = v;
        if (v == 0)
            return fw_after_tags(w);
        w->state = FW_TAG;
        return 0;
    case FW_TAG:
        w->state = FW_TAG_SIZE;
        return 0;
    case FW_TAG_SIZE:
        if (fw_skip(w, v) < 0)
            return -1;
        if (--w->tags == 0)
            return fw_after_tags(w);
        w->state = FW_TAG;
        return 0;
    case FW_TOPICS:
        w->topics = elements;
        if (elements == 0) {
            w->state = FW_TAIL;
            return 0;
        }
        return fw_topic(w);
    case FW_NAME:
        w->state = FW_PARTITIONS;
        return fw_skip(w, elements);
    case FW_PARTITIONS:
        w->partitions = elements;
        return elements ? fw_partition(w) : fw_tags(w, AT_TOPIC);
    case FW_ABORTED:
        w->aborted = elements;
        return fw_aborted(w);
    case FW_RECORDS:
        if (fw_skip(w, elements) < 0)
            return -1;
        return fw_tags(w, AT_PARTITION);
    default:
        return -1;
    }
}

/* Walk on over ``win``: the ``n`` (> 0) bytes of the body from w->pos that have arrived.
 * Returns how far w->pos moved (every byte before it lies before the top-level tagged
 * fields), 0 when the varint at w->pos is not whole in these bytes, -1 when the response is
 * malformed. Stops at the tail, at a step past these bytes, or at a varint they cut. */
static int64_t fw_walk(fwalk_t *w, const uint8_t *win, int64_t n)
{
    const int64_t start = w->pos;
    while (w->state != FW_TAIL && w->pos - start < n) {
        int64_t at = w->pos - start, i = at;
        uint32_t v = 0;
        int whole = 0;
        for (int shift = 0; shift <= 28 && i < n; shift += 7) {
            uint8_t b = win[i++];
            if (shift == 28 && b > 0x0f) /* more than 32 bits */
                return -1;
            v |= (uint32_t)(b & 0x7f) << shift;
            if (!(b & 0x80)) {
                if (b == 0 && shift > 0) /* a redundant zero byte */
                    return -1;
                whole = 1;
                break;
            }
        }
        if (!whole) {
            if (start + n >= w->size) /* these bytes run to the end: it is cut there */
                return -1;
            break;
        }
        w->pos += i - at;
        if (fw_value(w, v) < 0)
            return -1;
    }
    return w->pos - start;
}

/* ------------------------------------------------------------------ answers from the key-range cache
 * A key-range Fetch whose every partition's answer is a share the key-range cache holds is
 * answered here, without the event loop: the event loop publishes those shares in an
 * ``Answers`` table (proxy/keyrange/native.py: which shares, when, and what each one's
 * answer says), the loop looks the request's partitions up in it, takes them out, and sends
 * the response built of their bytes; the run hands back what it took (each share's handle)
 * for the event loop's bookkeeping (the cache, the ranges' interest, the metrics).
 *
 * The request shape answered (anything else, or any partition missing, is the event
 * loop's, exactly as before): Fetch v13-v17, sessionless (session id 0, epoch -1), topics
 * by id, each named once, each partition once, at most ANSWER_MAX_PARTITIONS in all, no
 * forgotten topics, no tagged field but KeyRanges (tag 10000) on partitions and at the top
 * level, every partition's effective ranges (its own, else the top level's) a non-empty
 * list of at most ANSWER_MAX_RANGES ranges, each with no tagged field; every partition one
 * the broker served this connection before (``served``). With the guard on, every topic
 * must also be one a plain Fetch could name (id_is_plain). The table is the proxy's, shared
 * by every run: a mutex guards it. proxy/net/native_checks.py (answer_keys) is the
 * request's read in Python, proxy/keyrange/native.py the answer's bytes. */

#define ANSWER_TAG 10000
#define ANSWER_FIRST_VERSION 13
#define ANSWER_LAST_VERSION 17
#define ANSWER_MAX_PARTITIONS 32
#define ANSWER_MAX_RANGES 16
#define ANSWER_KEY_FIXED (TOPIC_ID_BYTES + 4 + 1 + 8) /* topic id, partition, isolation level, fetch offset */
#define ANSWER_KEY_MAX (ANSWER_KEY_FIXED + 16 * ANSWER_MAX_RANGES)
#define SERVED_BYTES (TOPIC_ID_BYTES + 4)

typedef struct answer_entry {
    struct answer_entry *next;
    uint64_t hash;
    int64_t handle;
    PyObject *records; /* bytes: a reference of the table's, then of the run that took the entry */
    const uint8_t *records_at;
    int64_t records_len;
    uint32_t key_len, prefix_len, suffix_len;
    uint8_t data[]; /* the key, the partition's bytes before its records, after them */
} answer_entry;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    answer_entry **buckets;
    size_t mask; /* buckets - 1, a power of two less one */
    size_t count;
    int64_t bytes; /* what the entries and the buckets take (malloc'd), records aside */
} answers_t;

static uint64_t answer_hash(const uint8_t *key, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ key[i]) * 1099511628211ULL;
    return h;
}

/* The entry of ``key`` (its link in the chain, so it can be unlinked), or NULL; lock held. */
static answer_entry **answer_find(answers_t *t, const uint8_t *key, uint32_t n, uint64_t h)
{
    answer_entry **at = &t->buckets[h & t->mask];
    for (; *at != NULL; at = &(*at)->next)
        if ((*at)->hash == h && (*at)->key_len == n && memcmp((*at)->data, key, n) == 0)
            return at;
    return NULL;
}

static int answer_grow(answers_t *t)
{
    size_t size = (t->mask + 1) * 2;
    answer_entry **buckets = calloc(size, sizeof *buckets);
    if (buckets == NULL)
        return -1;
    for (size_t i = 0; i <= t->mask; i++) {
        answer_entry *e = t->buckets[i];
        while (e != NULL) {
            answer_entry *next = e->next;
            e->next = buckets[e->hash & (size - 1)];
            buckets[e->hash & (size - 1)] = e;
            e = next;
        }
    }
    t->bytes += (int64_t)((size - t->mask - 1) * sizeof *buckets);
    free(t->buckets);
    t->buckets = buckets;
    t->mask = size - 1;
    return 0;
}

static int64_t entry_bytes(const answer_entry *e)
{
    return (int64_t)(sizeof *e + e->key_len + e->prefix_len + e->suffix_len);
}

/* Free an entry no table holds any more; the GIL held (its records' reference). */
static void answer_free(answer_entry *e)
{
    Py_XDECREF(e->records);
    free(e);
}

static PyObject *answers_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    answers_t *t = (answers_t *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->buckets = calloc(64, sizeof *t->buckets);
    if (t->buckets == NULL) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    t->mask = 63;
    t->bytes = 64 * (int64_t)sizeof *t->buckets;
    pthread_mutex_init(&t->lock, NULL);
    return (PyObject *)t;
}

static void answers_clear_locked(answers_t *t, answer_entry **out)
{
    for (size_t i = 0; i <= t->mask; i++) {
        answer_entry *e = t->buckets[i];
        while (e != NULL) {
            answer_entry *next = e->next;
            t->bytes -= entry_bytes(e);
            e->next = *out;
            *out = e;
            e = next;
        }
        t->buckets[i] = NULL;
    }
    t->count = 0;
}

static void free_chain(answer_entry *e)
{
    while (e != NULL) {
        answer_entry *next = e->next;
        answer_free(e);
        e = next;
    }
}

static void answers_dealloc(answers_t *t)
{
    answer_entry *dropped = NULL;
    if (t->buckets != NULL) {
        answers_clear_locked(t, &dropped);
        free(t->buckets);
    }
    free_chain(dropped);
    pthread_mutex_destroy(&t->lock);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* put(key, handle, prefix, records, suffix): publish (or replace) the answer of ``key``. */
static PyObject *answers_put(answers_t *t, PyObject *args)
{
    Py_buffer key, prefix, suffix;
    long long handle;
    PyObject *records;
    if (!PyArg_ParseTuple(args, "y*Ly*O!y*", &key, &handle, &prefix, &PyBytes_Type, &records, &suffix))
        return NULL;
    answer_entry *e = NULL;
    if (key.len < ANSWER_KEY_FIXED + 16 || key.len > ANSWER_KEY_MAX || (key.len - ANSWER_KEY_FIXED) % 16 ||
        prefix.len > 1 << 20 || suffix.len > 1 << 20) {
        PyErr_SetString(PyExc_ValueError, "an answer's key holds a topic id, partition, isolation level, fetch "
                                          "offset and 1-16 ranges; its parts at most 1 MiB");
    } else if ((e = malloc(sizeof *e + (size_t)(key.len + prefix.len + suffix.len))) == NULL) {
        PyErr_NoMemory();
    }
    if (e == NULL) {
        PyBuffer_Release(&key);
        PyBuffer_Release(&prefix);
        PyBuffer_Release(&suffix);
        return NULL;
    }
    e->key_len = (uint32_t)key.len;
    e->prefix_len = (uint32_t)prefix.len;
    e->suffix_len = (uint32_t)suffix.len;
    memcpy(e->data, key.buf, (size_t)key.len);
    memcpy(e->data + key.len, prefix.buf, (size_t)prefix.len);
    memcpy(e->data + key.len + prefix.len, suffix.buf, (size_t)suffix.len);
    PyBuffer_Release(&key);
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&suffix);
    Py_INCREF(records);
    e->records = records;
    e->records_at = (const uint8_t *)PyBytes_AS_STRING(records);
    e->records_len = PyBytes_GET_SIZE(records);
    e->handle = handle;
    e->hash = answer_hash(e->data, e->key_len);
    answer_entry *replaced = NULL;
    pthread_mutex_lock(&t->lock);
    answer_entry **at = answer_find(t, e->data, e->key_len, e->hash);
    if (at != NULL) {
        replaced = *at;
        *at = replaced->next;
        t->bytes -= entry_bytes(replaced);
        t->count--;
    }
    if (t->count >= t->mask + 1 && answer_grow(t) < 0) {
        pthread_mutex_unlock(&t->lock);
        if (replaced != NULL)
            answer_free(replaced);
        answer_free(e);
        return PyErr_NoMemory();
    }
    answer_entry **bucket = &t->buckets[e->hash & t->mask];
    e->next = *bucket;
    *bucket = e;
    t->count++;
    t->bytes += entry_bytes(e);
    pthread_mutex_unlock(&t->lock);
    if (replaced != NULL)
        answer_free(replaced);
    Py_RETURN_NONE;
}

/* remove(key): the handle of the answer of ``key`` taken out of the table, or None. */
static PyObject *answers_remove(answers_t *t, PyObject *args)
{
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "y*", &key))
        return NULL;
    answer_entry *e = NULL;
    if (key.len <= ANSWER_KEY_MAX) {
        uint64_t h = answer_hash(key.buf, (size_t)key.len);
        pthread_mutex_lock(&t->lock);
        answer_entry **at = answer_find(t, key.buf, (uint32_t)key.len, h);
        if (at != NULL) {
            e = *at;
            *at = e->next;
            t->count--;
            t->bytes -= entry_bytes(e);
        }
        pthread_mutex_unlock(&t->lock);
    }
    PyBuffer_Release(&key);
    if (e == NULL)
        Py_RETURN_NONE;
    long long handle = e->handle;
    answer_free(e);
    return PyLong_FromLongLong(handle);
}

static PyObject *answers_clear(answers_t *t, PyObject *unused)
{
    answer_entry *dropped = NULL;
    pthread_mutex_lock(&t->lock);
    answers_clear_locked(t, &dropped);
    pthread_mutex_unlock(&t->lock);
    free_chain(dropped);
    Py_RETURN_NONE;
}

static Py_ssize_t answers_len(answers_t *t)
{
    pthread_mutex_lock(&t->lock);
    Py_ssize_t n = (Py_ssize_t)t->count;
    pthread_mutex_unlock(&t->lock);
    return n;
}

static PyObject *answers_get_bytes(answers_t *t, void *closure)
{
    pthread_mutex_lock(&t->lock);
    long long n = t->bytes;
    pthread_mutex_unlock(&t->lock);
    return PyLong_FromLongLong(n);
}

/* A request's read for an answer: the keys of its partitions, in the order of its topics and
 * theirs (the order of the answer), and where each topic's partitions begin. */
typedef struct {
    int version;
    int32_t correlation_id;
    int64_t request_bytes;
    int topics, partitions;
    int topic_first[ANSWER_MAX_PARTITIONS + 1]; /* topic t's partitions: [first[t], first[t + 1]) */
    const uint8_t *topic_id[ANSWER_MAX_PARTITIONS];
    int32_t partition[ANSWER_MAX_PARTITIONS];
    int32_t max_bytes[ANSWER_MAX_PARTITIONS]; /* each partition's limit: a larger share is the event loop's */
    uint8_t key[ANSWER_MAX_PARTITIONS][ANSWER_KEY_MAX];
    uint32_t key_len[ANSWER_MAX_PARTITIONS];
} answer_req_t;

/* A KeyRanges field's value (``p``..``end``, the whole field): 1 with ``ranges`` and ``count`` set
 * (count 0: null), 0 when it is not one the loop reads (more than ANSWER_MAX_RANGES, a
 * range with tagged fields, bytes left over), -1 when it does not parse. */
static int answer_ranges(const uint8_t *p, const uint8_t *end, const uint8_t **ranges, uint32_t *count)
{
    uint32_t length;
    if ((p = read_canonical(p, end, &length)) == NULL)
        return -1;
    if (length == 0) {
        *count = 0;
        *ranges = NULL;
        return p == end ? 1 : 0;
    }
    if (length - 1 > ANSWER_MAX_RANGES)
        return 0;
    *ranges = p;
    *count = length - 1;
    for (uint32_t i = 0; i < length - 1; i++) {
        if ((p = skip(p, end, 16)) == NULL)
            return -1;
        if (p >= end || *p != 0) /* a range's tagged fields: none */
            return p >= end ? -1 : 0;
        p++;
    }
    return p == end ? 1 : 0;
}

/* A tagged-field section (``*pp``: at its count) that may hold KeyRanges alone: 1 with
 * ``ranges`` and ``count`` set (``present`` 0: absent), 0 when it holds another field or more than one,
 * -1 when it does not parse. */
static int answer_tags(const uint8_t **pp, const uint8_t *end, int *present, const uint8_t **ranges,
                       uint32_t *count)
{
    uint32_t fields, tag, size;
    const uint8_t *p = *pp;
    *present = 0;
    if ((p = read_canonical(p, end, &fields)) == NULL || fields > MAX_TAGGED_FIELDS)
        return -1;
    if (fields > 1)
        return 0;
    if (fields == 1) {
        if ((p = read_canonical(read_canonical(p, end, &tag), end, &size)) == NULL)
            return -1;
        const uint8_t *value = p;
        if ((p = skip(p, end, size)) == NULL)
            return -1;
        if (tag != ANSWER_TAG)
            return 0;
        int read = answer_ranges(value, p, ranges, count);
        if (read <= 0)
            return read;
        *present = 1;
    }
    *pp = p;
    return 1;
}

static int served_holds(const uint8_t *served, size_t len, const uint8_t *id, const uint8_t *partition)
{
    for (size_t at = 0; at + SERVED_BYTES <= len; at += SERVED_BYTES)
        if (memcmp(served + at, id, TOPIC_ID_BYTES) == 0 && memcmp(served + at + TOPIC_ID_BYTES, partition, 4) == 0)
            return 1;
    return 0;
}

/* Read a Fetch request (``frame``: from its size prefix, up to ``end``) for an answer: 0 with
 * ``q`` filled when it has the shape the loop answers and every partition is ``served``; 1
 * when it is the event loop's; -1 when these bytes end first or do not parse. */
static int answer_request(const uint8_t *frame, const uint8_t *end, int guarded, const guard_t *guard,
                          const uint8_t *served, size_t served_len, answer_req_t *q)
{
    if (end - frame < 12)
        return -1;
    int64_t size = (int32_t)be32(frame);
    if (size < 8 || end - frame < size + 4)
        return -1;
    end = frame + 4 + size;
    if (be16(frame + 4) != API_FETCH)
        return 1;
    int version = be16(frame + 6);
    if (version < ANSWER_FIRST_VERSION || version > ANSWER_LAST_VERSION)
        return 1;
    q->version = version;
    q->correlation_id = (int32_t)be32(frame + 8);
    q->request_bytes = size + 4;
    const uint8_t *p = skip_header_rest(frame + 12, end, 1); /* every version answered is flexible */
    if (p == NULL)
        return -1;
    uint32_t count;
    /* replica id (to v14), max wait, min bytes, max bytes */
    if ((p = skip(p, end, (uint64_t)((version <= FETCH_LAST_REPLICA_ID ? 4 : 0) + 12))) == NULL || end - p < 9)
        return -1;
    const uint8_t level = p[0];
    int32_t session_id = (int32_t)be32(p + 1), epoch = (int32_t)be32(p + 5);
    p += 9;
    if (session_id != 0 || epoch != -1 || level > 1)
        return 1;
    uint32_t topics, partitions;
    if ((p = fetch_count(p, end, 1, &topics)) == NULL)
        return -1;
    if (topics == 0 || topics > ANSWER_MAX_PARTITIONS)
        return 1;
    const uint8_t *own[ANSWER_MAX_PARTITIONS];
    uint32_t own_count[ANSWER_MAX_PARTITIONS];
    int own_present[ANSWER_MAX_PARTITIONS];
    const uint8_t *offset_at[ANSWER_MAX_PARTITIONS];
    int n = 0;
    q->topics = (int)topics;
    for (uint32_t t = 0; t < topics; t++) {
        if (end - p < TOPIC_ID_BYTES)
            return -1;
        const uint8_t *id = p;
        p += TOPIC_ID_BYTES;
        for (uint32_t u = 0; u < t; u++)
            if (memcmp(q->topic_id[u], id, TOPIC_ID_BYTES) == 0)
                return 1;
        if (guarded && !id_is_plain(id, guard))
            return 1;
        q->topic_id[t] = id;
        q->topic_first[t] = n;
        if ((p = fetch_count(p, end, 1, &partitions)) == NULL)
            return -1;
        if (partitions == 0 || partitions > (uint32_t)(ANSWER_MAX_PARTITIONS - n))
            return 1;
        for (uint32_t i = 0; i < partitions; i++) {
            /* partition, current leader epoch, fetch offset, last fetched epoch, log start
             * offset, partition max bytes */
            if (end - p < 32)
                return -1;
            for (int j = q->topic_first[t]; j < n; j++)
                if (memcmp(offset_at[j] - 8, p, 4) == 0)
                    return 1; /* a partition named twice */
            q->partition[n] = (int32_t)be32(p);
            q->max_bytes[n] = (int32_t)be32(p + 28);
            offset_at[n] = p + 8;
            p += 32;
            int read = answer_tags(&p, end, &own_present[n], &own[n], &own_count[n]);
            if (read <= 0)
                return read < 0 ? -1 : 1;
            n++;
        }
        if ((p = read_canonical(p, end, &count)) == NULL)
            return -1;
        if (count != 0) /* the topic's tagged fields: none */
            return 1;
    }
    q->topic_first[topics] = n;
    q->partitions = n;
    if ((p = fetch_count(p, end, 1, &topics)) == NULL)
        return -1;
    if (topics != 0) /* forgotten topics: none */
        return 1;
    const uint8_t *rack;
    uint64_t rack_len;
    if ((p = fetch_string(p, end, 1, &rack, &rack_len)) == NULL)
        return -1;
    int top_present;
    const uint8_t *top;
    uint32_t top_count;
    int read = answer_tags(&p, end, &top_present, &top, &top_count);
    if (read <= 0)
        return read < 0 ? -1 : 1;
    if (p != end)
        return -1;
    for (int i = 0; i < n; i++) {
        const uint8_t *ranges = own_present[i] && own_count[i] ? own[i] : NULL;
        uint32_t ranges_count = own_present[i] ? own_count[i] : 0;
        if (own_present[i] && own[i] == NULL && top_present) { /* its own null: the top level's */
            ranges = top;
            ranges_count = top_count;
        } else if (!own_present[i] && top_present) {
            ranges = top;
            ranges_count = top_count;
        }
        if (ranges == NULL || ranges_count == 0)
            return 1; /* the whole partition */
        int t = 0;
        while (q->topic_first[t + 1] <= i)
            t++;
        const uint8_t *partition = offset_at[i] - 8;
        if (!served_holds(served, served_len, q->topic_id[t], partition))
            return 1;
        uint8_t *key = q->key[i];
        memcpy(key, q->topic_id[t], TOPIC_ID_BYTES);
        memcpy(key + TOPIC_ID_BYTES, partition, 4);
        key[TOPIC_ID_BYTES + 4] = level;
        memcpy(key + TOPIC_ID_BYTES + 5, offset_at[i], 8);
        uint8_t *at = key + ANSWER_KEY_FIXED;
        for (uint32_t r = 0; r < ranges_count; r++, at += 16)
            memcpy(at, ranges + 17 * r, 16); /* start, end; the range's empty tagged fields after */
        q->key_len[i] = ANSWER_KEY_FIXED + 16 * ranges_count;
    }
    return 0;
}

/* Whether the table holds every partition's answer; with ``taken`` (ANSWER_MAX_PARTITIONS
 * places), each is also taken out of it, all or none. */
static int answers_take(answers_t *t, const answer_req_t *q, answer_entry **taken)
{
    uint64_t hashes[ANSWER_MAX_PARTITIONS];
    for (int i = 0; i < q->partitions; i++)
        hashes[i] = answer_hash(q->key[i], q->key_len[i]);
    int all = 1;
    pthread_mutex_lock(&t->lock);
    for (int i = 0; i < q->partitions && all; i++) {
        answer_entry **at = answer_find(t, q->key[i], q->key_len[i], hashes[i]);
        /* a share above the partition's limit is served in parts, by the event loop */
        all = at != NULL && (*at)->records_len <= (int64_t)q->max_bytes[i];
    }
    if (all && taken != NULL) {
        for (int i = 0; i < q->partitions; i++) {
            answer_entry **at = answer_find(t, q->key[i], q->key_len[i], hashes[i]);
            answer_entry *e = *at;
            *at = e->next;
            e->next = NULL;
            t->count--;
            t->bytes -= entry_bytes(e);
            taken[i] = e;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return all;
}

static inline uint8_t *put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
    return p + 4;
}

static uint8_t *put_uvarint(uint8_t *p, uint32_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* An answer's bytes, as the event loop's codec writes the response: size, correlation id,
 * the header's tagged fields (none); throttle time 0, error 0, session id 0; each topic (its
 * id, its partitions: index, then the share's bytes, records and tagged fields; no tagged
 * field of its own); no top-level tagged field. ``meta``: room for the bytes around the
 * records (answer_meta_bytes); ``iov``: 2 + 3 x partitions places. Returns the iovecs used. */
#define ANSWER_META_FIXED (4 + 4 + 1 + 4 + 2 + 4 + 5 + 1)
static size_t answer_meta_bytes(const answer_req_t *q, answer_entry *const *taken)
{
    size_t n = ANSWER_META_FIXED + (size_t)q->topics * (TOPIC_ID_BYTES + 5 + 1);
    for (int i = 0; i < q->partitions; i++)
        n += 4 + taken[i]->prefix_len + taken[i]->suffix_len;
    return n;
}

static int answer_iov(const answer_req_t *q, answer_entry *const *taken, uint8_t *meta, struct iovec *iov,
                      int64_t *total)
{
    int used = 0;
    uint8_t *p = meta + 4, *segment = meta;
    p = put_be32(p, (uint32_t)q->correlation_id);
    *p++ = 0;                         /* header tagged fields */
    p = put_be32(p, 0);               /* throttle time */
    *p++ = 0, *p++ = 0;               /* error code */
    p = put_be32(p, 0);               /* session id */
    p = put_uvarint(p, (uint32_t)q->topics + 1);
    int64_t records = 0;
    for (int t = 0; t < q->topics; t++) {
        memcpy(p, q->topic_id[t], TOPIC_ID_BYTES);
        p += TOPIC_ID_BYTES;
        p = put_uvarint(p, (uint32_t)(q->topic_first[t + 1] - q->topic_first[t]) + 1);
        for (int i = q->topic_first[t]; i < q->topic_first[t + 1]; i++) {
            const answer_entry *e = taken[i];
            p = put_be32(p, (uint32_t)q->partition[i]);
            memcpy(p, e->data + e->key_len, e->prefix_len);
            p += e->prefix_len;
            iov[used++] = (struct iovec){.iov_base = segment, .iov_len = (size_t)(p - segment)};
            iov[used++] = (struct iovec){.iov_base = (void *)e->records_at, .iov_len = (size_t)e->records_len};
            records += e->records_len;
            segment = p;
            memcpy(p, e->data + e->key_len + e->prefix_len, e->suffix_len);
            p += e->suffix_len;
        }
        *p++ = 0; /* the topic's tagged fields */
    }
    *p++ = 0; /* top-level tagged fields */
    iov[used++] = (struct iovec){.iov_base = segment, .iov_len = (size_t)(p - segment)};
    *total = (int64_t)(p - meta) + records;
    put_be32(meta, (uint32_t)(*total - 4));
    return used;
}

static PyMethodDef answers_methods[] = {
    {"put", (PyCFunction)answers_put, METH_VARARGS,
     "put(key, handle, prefix, records, suffix): publish the answer of key (replacing one of the same key)."},
    {"remove", (PyCFunction)answers_remove, METH_VARARGS,
     "remove(key): the handle of the answer of key, taken out of the table; None if it holds none."},
    {"clear", (PyCFunction)answers_clear, METH_NOARGS, "Drop every answer."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef answers_getset[] = {
    {"bytes", (getter)answers_get_bytes, NULL, "What the table's entries and buckets take, records aside.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods answers_sequence = {.sq_length = (lenfunc)answers_len};

static PyTypeObject answers_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.net._cpump.Answers",
    .tp_basicsize = sizeof(answers_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Answers of key-range Fetches the loop sends itself: key -> a partition's bytes (see the module).",
    .tp_new = answers_new,
    .tp_dealloc = (destructor)answers_dealloc,
    .tp_methods = answers_methods,
    .tp_getset = answers_getset,
    .tp_as_sequence = &answers_sequence,
};

/* ------------------------------------------------------------------ moving bytes */

/* Splice what can move now. Sets *want_src / *want_dst to what it waits for; returns 1 when
 * something moved, 0 when nothing could, -1 on an error (errno set; 0 for an end of stream). */
static int mover_step(mover_t *m, int *want_src, int *want_dst)
{
    int progress = 0;
    *want_src = *want_dst = 0;
    for (;;) {
        int moved = 0, src_dry = 0;
        if (m->remaining > 0 && m->held < m->capacity) {
            int64_t ask = m->capacity - m->held;
            if (ask > m->remaining)
                ask = m->remaining;
            ssize_t n = splice(m->src, NULL, m->pipe_w, NULL, (size_t)ask, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
            if (n > 0) {
                m->held += n;
                m->remaining -= n;
                moved = 1;
            } else if (n == 0) {
                errno = 0;
                return -1;
            } else if (errno == EAGAIN) {
                src_dry = 1;
            } else if (errno != EINTR) {
                return -1;
            }
        }
        if (m->held > 0) {
            ssize_t n = splice(m->pipe_r, NULL, m->dst, NULL, (size_t)m->held, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
            if (n > 0) {
                m->held -= n;
                moved = 1;
            } else if (n < 0 && errno == EAGAIN) {
                *want_dst = 1;
            } else if (n < 0 && errno != EINTR) {
                return -1;
            }
        }
        if (moved) {
            progress = 1;
            continue;
        }
        /* Wait for the source only when the pipe is empty: a pipe whose slots are full
         * refuses more even with room in bytes, and the source would wake us at once. */
        if (src_dry && m->held == 0)
            *want_src = 1;
        else if (m->held > 0)
            *want_dst = 1;
        return progress;
    }
}

/* ------------------------------------------------------------------ the run */

enum { REQ_PEEK, REQ_FORWARD, REQ_ANSWER };
enum { RESP_IDLE, RESP_HEAD, RESP_SPLICE, RESP_READ, RESP_WRITE, RESP_HOLD, RESP_WALK, RESP_TAIL };

typedef struct {
    /* arguments */
    int client, upstream, wake;
    const uint8_t *classes;
    guard_t guard;
    int64_t max_frame;
    int max_inflight;
    int64_t slice_ns, idle_ns;
    int req_pipe_r, req_pipe_w, resp_pipe_r, resp_pipe_w;
    int64_t req_capacity, resp_capacity;
    /* in flight, a ring */
    flight_t *ring;
    int head, count;
    /* answered */
    done_t *done;
    int done_count, done_cap;
    /* state */
    int req_state, resp_state;
    mover_t req_mover, resp_mover;
    uint8_t header[8];
    int header_filled;
    uint8_t *buffer; /* a Produce response read whole: size prefix and body; a Fetch response's tail */
    int64_t buffer_size, buffer_done;
    fwalk_t walk; /* the Fetch response being walked (RESP_WALK) */
    int lowat; /* the broker socket's SO_RCVLOWAT before a walk raised it; -1 when untouched */
    int upstream_hup; /* poll saw the broker's end of stream */
    int64_t requests; /* forwarded in this run */
    int64_t spliced; /* of them, those of at least SPLICED_MIN bytes */
    int reason;
    char message[160];
    int error;
    /* answers (REQ_ANSWER): the table, the partitions the broker served this connection */
    answers_t *answers;
    const uint8_t *served;
    size_t served_len;
    uint8_t *answer_meta;
    struct iovec answer_iov[2 * ANSWER_MAX_PARTITIONS + 1];
    int answer_iovcnt, answer_iov_at;
    flight_t answer_flight;
    int64_t answer_bytes;
    answer_entry **taken; /* every entry the run took, in order: handed back, then freed */
    int taken_count, taken_cap;
} run_t;

static void stop(run_t *r, int reason)
{
    if (r->reason == R_NONE)
        r->reason = reason;
}

static int fail(run_t *r, int reason, int error, const char *message)
{
    r->reason = reason;
    r->error = error;
    snprintf(r->message, sizeof r->message, "%s", message);
    return -1;
}

static int done_push(run_t *r, const flight_t *f, int64_t response_bytes, int64_t now)
{
    if (r->done_count == r->done_cap) {
        int cap = r->done_cap ? r->done_cap * 2 : 256;
        done_t *grown = realloc(r->done, sizeof(done_t) * (size_t)cap);
        if (grown == NULL)
            return fail(r, R_BROKEN, ENOMEM, "out of memory");
        r->done = grown;
        r->done_cap = cap;
    }
    done_t *d = &r->done[r->done_count++];
    d->api_key = f->api_key;
    d->request_bytes = f->request_bytes;
    d->response_bytes = response_bytes;
    d->latency_ns = now - f->start_ns;
    if (r->done_count >= DONE_MAX)
        stop(r, R_SLICE);
    return 0;
}

/* One step of a frame's bytes through ``m``; the events it waits for are added to
 * *src_events (POLLIN) and *dst_events (POLLOUT), *progress says whether any moved.
 * Returns 1 once the frame is through, 0 before, -1 on a failure (the run ends). */
static int move_frame(run_t *r, mover_t *m, short *src_events, short *dst_events, int *progress,
                      const char *ended, const char *failed)
{
    int want_src, want_dst;
    int moved = mover_step(m, &want_src, &want_dst);
    if (moved < 0) {
        int error = errno;
        return fail(r, R_BROKEN, error, error == 0 ? ended : failed);
    }
    *progress = moved;
    if (want_src)
        *src_events |= POLLIN;
    if (want_dst)
        *dst_events |= POLLOUT;
    return m->remaining == 0 && m->held == 0;
}

/* Whether the table lets a Fetch of ``version`` be answered (``peek``: its first ``n``
 * bytes), and how: 0 it is not, 1 it is, with the request taken from the socket and the
 * answer begun (REQ_ANSWER), 2 its answers are all there but a response is still owed
 * (the answer waits for it, responses keep their order), -1 on a failure. */
static int try_answer(run_t *r, const uint8_t *peek, ssize_t n)
{
    if (r->answers == NULL || n < 12 || be16(peek + 4) != API_FETCH)
        return 0;
    int version = be16(peek + 6);
    if (version < 0 || version >= VERSIONS)
        return 0;
    int entry = r->classes[API_FETCH * VERSIONS + version];
    if ((entry & CLASS_MASK) == CLASS_PYTHON)
        return 0;
    answer_req_t q;
    if (answer_request(peek, peek + n, entry & CLASS_GUARDED, &r->guard, r->served, r->served_len, &q) != 0)
        return 0;
    if (r->count > 0 || r->resp_state != RESP_IDLE || r->header_filled)
        return answers_take(r->answers, &q, NULL) ? 2 : 0;
    if (r->taken_count + q.partitions > r->taken_cap) {
        int cap = r->taken_cap ? r->taken_cap * 2 : 256;
        while (cap < r->taken_count + q.partitions)
            cap *= 2;
        answer_entry **grown = realloc(r->taken, sizeof *grown * (size_t)cap);
        if (grown == NULL)
            return fail(r, R_BROKEN, ENOMEM, "out of memory");
        r->taken = grown;
        r->taken_cap = cap;
    }
    answer_entry **taken = r->taken + r->taken_count;
    if (!answers_take(r->answers, &q, taken))
        return 0;
    r->taken_count += q.partitions; /* the run's now, whatever follows */
    uint8_t *meta = malloc(answer_meta_bytes(&q, taken));
    if (meta == NULL)
        return fail(r, R_BROKEN, ENOMEM, "out of memory");
    /* The request is in the socket whole (it was peeked whole): take it out. */
    uint8_t discard[FETCH_PEEK_MAX];
    int64_t left = q.request_bytes;
    while (left > 0) {
        ssize_t got = recv(r->client, discard, (size_t)left, MSG_DONTWAIT);
        if (got > 0) {
            left -= got;
        } else if (!(got < 0 && errno == EINTR)) {
            free(meta);
            return fail(r, R_BROKEN, got < 0 ? errno : 0, "reading a request the loop answers failed");
        }
    }
    r->answer_meta = meta;
    r->answer_iovcnt = answer_iov(&q, taken, meta, r->answer_iov, &r->answer_bytes);
    r->answer_iov_at = 0;
    r->answer_flight = (flight_t){.api_key = API_FETCH, .version = (int16_t)version,
                                  .correlation_id = q.correlation_id, .cls = CLASS_FETCH,
                                  .request_bytes = q.request_bytes, .start_ns = now_ns()};
    r->req_state = REQ_ANSWER;
    return 1;
}

/* Send what is left of the answer begun: 1 once sent, 0 while the socket is full, -1 on a
 * failure. */
static int send_answer(run_t *r, short *events_client, int *progress)
{
    *progress = 0;
    while (r->answer_iov_at < r->answer_iovcnt) {
        struct msghdr message = {.msg_iov = r->answer_iov + r->answer_iov_at,
                                 .msg_iovlen = (size_t)(r->answer_iovcnt - r->answer_iov_at)};
        ssize_t sent = sendmsg(r->client, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                *events_client |= POLLOUT;
                return 0;
            }
            return fail(r, R_BROKEN, errno, "sending an answer failed");
        }
        *progress = 1;
        while (sent > 0 && r->answer_iov_at < r->answer_iovcnt) {
            struct iovec *v = &r->answer_iov[r->answer_iov_at];
            if ((size_t)sent >= v->iov_len) {
                sent -= (ssize_t)v->iov_len;
                r->answer_iov_at++;
            } else {
                v->iov_base = (uint8_t *)v->iov_base + sent;
                v->iov_len -= (size_t)sent;
                sent = 0;
            }
        }
        while (r->answer_iov_at < r->answer_iovcnt && r->answer_iov[r->answer_iov_at].iov_len == 0)
            r->answer_iov_at++;
    }
    free(r->answer_meta);
    r->answer_meta = NULL;
    r->req_state = REQ_PEEK;
    return done_push(r, &r->answer_flight, r->answer_bytes, now_ns()) < 0 ? -1 : 1;
}

/* The request side: peek at the next request, and forward it when the run may (or answer
 * it, when the table holds its answer). Returns 1 on progress, 0 when waiting (events in
 * *events_client / *events_upstream), -1 to end. */
static int step_requests(run_t *r, short *events_client, short *events_upstream, int *dry)
{
    if (r->req_state == REQ_ANSWER) {
        int progress, sent = send_answer(r, events_client, &progress);
        return sent < 0 ? -1 : (sent > 0 ? 1 : progress);
    }
    if (r->req_state == REQ_PEEK) {
        if (r->reason != R_NONE || r->count >= r->max_inflight)
            return 0;
        uint8_t peek[FETCH_PEEK_MAX];
        ssize_t n = peek_request(r->client, peek);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                *events_client |= POLLIN;
                *dry = 1;
                return 0;
            }
            stop(r, R_PYTHON_REQUEST); /* the event loop meets the error itself */
            return 0;
        }
        int cls = classify(peek, n, r->classes, r->max_frame, &r->guard);
        if (cls == CLASS_PYTHON) {
            int answered = try_answer(r, peek, n);
            if (answered < 0)
                return -1;
            if (answered == 1) {
                int progress, sent = send_answer(r, events_client, &progress);
                return sent < 0 ? -1 : 1;
            }
            if (answered == 2)
                return 0; /* the response owed comes first: the response side waits for it */
            stop(r, R_PYTHON_REQUEST);
            return 0;
        }
        int64_t size = (int32_t)be32(peek);
        int api_key = be16(peek + 4), version = be16(peek + 6);
        flight_t *f = &r->ring[(r->head + r->count) % r->max_inflight];
        f->api_key = (int16_t)api_key;
        f->version = (int16_t)version;
        f->correlation_id = (int32_t)be32(peek + 8);
        f->cls = cls;
        f->request_bytes = size + 4;
        f->start_ns = now_ns();
        r->count++;
        r->req_mover.remaining = size + 4;
        r->req_state = REQ_FORWARD;
    }
    int progress, through = move_frame(r, &r->req_mover, events_client, events_upstream, &progress,
                                       "client's stream ended inside a request", "forwarding a request failed");
    if (through < 0)
        return -1;
    if (through) {
        r->req_state = REQ_PEEK;
        r->requests++;
        if (r->ring[(r->head + r->count - 1) % r->max_inflight].request_bytes >= SPLICED_MIN)
            r->spliced++;
        return 1;
    }
    return progress;
}

static int complete_response(run_t *r, int64_t response_bytes)
{
    flight_t f = r->ring[r->head];
    r->head = (r->head + 1) % r->max_inflight;
    r->count--;
    r->resp_state = RESP_IDLE;
    r->header_filled = 0;
    return done_push(r, &f, response_bytes, now_ns());
}

/* Read the rest of the buffered response from ``fd`` (``sending`` 0), or send it to ``fd``
 * (``sending`` 1), as far as the socket allows now. Returns 1 once done, 0 while waiting
 * (its event added to *events), -1 on a failure; *progress says whether any byte moved. */
static int transfer_buffer(run_t *r, int fd, int sending, short *events, int *progress, const char *failed)
{
    *progress = 0;
    while (r->buffer_done < r->buffer_size) {
        uint8_t *at = r->buffer + r->buffer_done;
        size_t count = (size_t)(r->buffer_size - r->buffer_done);
        ssize_t n = sending ? send(fd, at, count, MSG_DONTWAIT | MSG_NOSIGNAL) : recv(fd, at, count, MSG_DONTWAIT);
        if (n > 0) {
            r->buffer_done += n;
            *progress = 1;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            *events |= sending ? POLLOUT : POLLIN;
            return 0;
        }
        return fail(r, R_BROKEN, n < 0 ? errno : 0, failed);
    }
    return 1;
}

/* While a walk waits for a varint the peek cut, the broker's socket holds ``n`` bytes at
 * least: it must wake the loop only once it holds more (POLLIN alone would at once). */
static void lowat_above(run_t *r, ssize_t n)
{
    if (r->lowat < 0) {
        int old = 1;
        socklen_t length = sizeof old;
        if (getsockopt(r->upstream, SOL_SOCKET, SO_RCVLOWAT, &old, &length) != 0)
            old = 1;
        r->lowat = old;
    }
    int want = (int)n + 1;
    setsockopt(r->upstream, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want);
}

static void lowat_restore(run_t *r)
{
    if (r->lowat >= 0) {
        setsockopt(r->upstream, SOL_SOCKET, SO_RCVLOWAT, &r->lowat, sizeof r->lowat);
        r->lowat = -1;
    }
}

/* A Fetch response on its way (RESP_WALK): what the walk has shown to lie before the
 * top-level tagged fields is spliced on; the loop peeks at the socket only when everything
 * before the walk's position has left it. At the tagged fields: passed on when empty (one
 * zero byte, or none), else read for the event loop once all before them has gone out. */
static int step_walk(run_t *r, short *events_client, short *events_upstream)
{
    fwalk_t *w = &r->walk;
    mover_t *m = &r->resp_mover;
    int any = 0;
    for (;;) {
        if (m->remaining > 0 || m->held > 0) {
            int progress, through = move_frame(r, m, events_upstream, events_client, &progress,
                                               "broker's stream ended inside a response", "relaying a response failed");
            if (through < 0)
                return -1;
            any |= progress;
            if (m->remaining > 0)
                return any; /* the socket's next bytes are not the walk's yet */
        }
        int64_t left = w->size - w->pos;
        if (w->state == FW_TAIL && left == 0) {
            if (m->held > 0)
                return any;
            return complete_response(r, w->size + 4) < 0 ? -1 : 1;
        }
        if (left == 0) /* a varint past the end */
            return fail(r, R_PROTOCOL, 0, "Fetch response ends inside a field");
        uint8_t win[WALK_WINDOW];
        ssize_t n = recv(r->upstream, win, (size_t)(left < WALK_WINDOW ? left : WALK_WINDOW), MSG_PEEK | MSG_DONTWAIT);
        lowat_restore(r);
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR)
                return fail(r, R_BROKEN, errno, "relaying a response failed");
            *events_upstream |= POLLIN;
            return any;
        }
        if (n == 0)
            return fail(r, R_BROKEN, 0, "broker's stream ended inside a response");
        if (w->state == FW_TAIL) {
            if (left == 1 && win[0] == 0) { /* no tagged field: nothing to rewrite */
                m->remaining = 1;
                w->pos = w->size;
                any = 1;
                continue;
            }
            if (m->held > 0) /* what comes before it must have reached the client first */
                return any;
            r->buffer = malloc((size_t)(8 + left));
            if (r->buffer == NULL)
                return fail(r, R_BROKEN, ENOMEM, "out of memory");
            memcpy(r->buffer, r->header, 8); /* its size and correlation id, then the tail */
            r->buffer_size = 8 + left;
            r->buffer_done = 8;
            r->resp_state = RESP_TAIL;
            return 1;
        }
        int64_t moved = fw_walk(w, win, n);
        if (moved < 0)
            return fail(r, R_PROTOCOL, 0, "malformed Fetch response");
        if (moved > 0) {
            m->remaining = moved;
            any = 1;
            continue;
        }
        if (r->upstream_hup) /* the varint it waits for will never be whole */
            return fail(r, R_BROKEN, 0, "broker's stream ended inside a response");
        lowat_above(r, n);
        *events_upstream |= POLLIN | POLLRDHUP;
        return any;
    }
}

/* The response side: the next response of the oldest request in flight. */
static int step_responses(run_t *r, short *events_client, short *events_upstream)
{
    if (r->resp_state == RESP_IDLE) {
        if (r->count == 0 || r->reason != R_NONE)
            return 0;
        r->resp_state = RESP_HEAD;
    }
    if (r->resp_state == RESP_HEAD) {
        while (r->header_filled < 8) {
            ssize_t n = recv(r->upstream, r->header + r->header_filled, (size_t)(8 - r->header_filled), MSG_DONTWAIT);
            if (n > 0) {
                r->header_filled += (int)n;
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
                *events_upstream |= POLLIN;
                if (r->header_filled == 0)
                    r->resp_state = RESP_IDLE; /* still at a boundary */
                return 0;
            }
            if (n == 0 && r->header_filled == 0) {
                r->resp_state = RESP_IDLE;
                stop(r, R_UPSTREAM_CLOSED);
                return 0;
            }
            return fail(r, R_BROKEN, n < 0 ? errno : 0, "broker's stream ended inside a response");
        }
        const flight_t *f = &r->ring[r->head];
        int64_t size = (int32_t)be32(r->header);
        int32_t correlation_id = (int32_t)be32(r->header + 4);
        if (size < 4 || size > r->max_frame) {
            char message[160];
            snprintf(message, sizeof message, "frame size %lld outside 4..%lld", (long long)size,
                     (long long)r->max_frame);
            return fail(r, R_PROTOCOL, 0, message);
        }
        if (correlation_id != f->correlation_id) {
            char message[160];
            snprintf(message, sizeof message, "broker answered correlation id %d, expected %d", correlation_id,
                     f->correlation_id);
            return fail(r, R_PROTOCOL, 0, message);
        }
        if (f->cls == CLASS_PRODUCE) {
            r->buffer = malloc((size_t)size + 4);
            if (r->buffer == NULL)
                return fail(r, R_BROKEN, ENOMEM, "out of memory");
            memcpy(r->buffer, r->header, 8);
            r->buffer_size = size + 4;
            r->buffer_done = 8;
            r->resp_state = RESP_READ;
        } else {
            /* The pipe is empty at a frame's start: the 8 bytes go in whole. */
            if (write(r->resp_pipe_w, r->header, 8) != 8)
                return fail(r, R_BROKEN, errno, "writing to the splice pipe failed");
            r->resp_mover.held = 8;
            if (f->cls == CLASS_FETCH) {
                fw_start(&r->walk, f->version, size);
                r->resp_mover.remaining = 0;
                r->resp_state = RESP_WALK;
            } else {
                r->resp_mover.remaining = size - 4;
                r->resp_state = RESP_SPLICE;
            }
        }
    }
    if (r->resp_state == RESP_WALK)
        return step_walk(r, events_client, events_upstream);
    if (r->resp_state == RESP_TAIL) {
        int progress, through = transfer_buffer(r, r->upstream, 0, events_upstream, &progress,
                                                "broker's stream ended inside a response");
        if (through <= 0)
            return through < 0 ? -1 : progress;
        r->resp_state = RESP_HOLD;
        r->reason = R_PYTHON_RESPONSE; /* it must be handed back whatever else stopped the run */
        return 1;
    }
    if (r->resp_state == RESP_SPLICE) {
        int progress, through = move_frame(r, &r->resp_mover, events_upstream, events_client, &progress,
                                           "broker's stream ended inside a response", "relaying a response failed");
        if (through < 0)
            return -1;
        if (through) {
            int64_t size = (int32_t)be32(r->header);
            if (complete_response(r, size + 4) < 0)
                return -1;
            return 1;
        }
        return progress;
    }
    if (r->resp_state == RESP_READ) {
        int progress, through = transfer_buffer(r, r->upstream, 0, events_upstream, &progress,
                                                "broker's stream ended inside a response");
        if (through <= 0)
            return through < 0 ? -1 : progress;
        const flight_t *f = &r->ring[r->head];
        if (produce_response_needs_python(r->buffer + 4, (size_t)(r->buffer_size - 4), f->version)) {
            r->resp_state = RESP_HOLD;
            r->reason = R_PYTHON_RESPONSE; /* it must be handed back whatever else stopped the run */
            return 1;
        }
        r->buffer_done = 0;
        r->resp_state = RESP_WRITE;
    }
    if (r->resp_state == RESP_WRITE) {
        int progress, through = transfer_buffer(r, r->client, 1, events_client, &progress,
                                                "sending a response failed");
        if (through <= 0)
            return through < 0 ? -1 : progress;
        int64_t total = r->buffer_size;
        free(r->buffer);
        r->buffer = NULL;
        if (complete_response(r, total) < 0)
            return -1;
        return 1;
    }
    return 0;
}

static int at_boundary(const run_t *r)
{
    return r->req_state == REQ_PEEK &&
           ((r->resp_state == RESP_IDLE && r->header_filled == 0) || r->resp_state == RESP_HOLD);
}

static void run_loop(run_t *r)
{
    int64_t start = now_ns();
    int64_t slice_end = start + r->slice_ns;
    int64_t last_activity = start;
    for (;;) {
        short events_client = 0, events_upstream = 0;
        int dry = 0;
        int a = step_requests(r, &events_client, &events_upstream, &dry);
        if (a < 0)
            return;
        int b = step_responses(r, &events_client, &events_upstream);
        if (b < 0)
            return;
        int64_t now = now_ns();
        if (a > 0 || b > 0) {
            last_activity = now;
            continue; /* look again before waiting: both sides may move further */
        }
        if (now >= slice_end)
            stop(r, R_SLICE);
        if (dry && r->count == 0 && r->req_state == REQ_PEEK && now - last_activity >= r->idle_ns)
            stop(r, R_IDLE);
        if (r->reason != R_NONE && at_boundary(r))
            return;
        int64_t deadline = slice_end;
        if (r->count == 0 && r->idle_ns < INT64_MAX / 2 && last_activity + r->idle_ns < deadline)
            deadline = last_activity + r->idle_ns;
        int timeout = (int)((deadline - now + 999999) / 1000000);
        if (r->reason != R_NONE || timeout < 1)
            timeout = r->reason != R_NONE ? -1 : 1;
        struct pollfd fds[3] = {
            {.fd = r->wake, .events = POLLIN},
            {.fd = events_client ? r->client : -1, .events = events_client},
            {.fd = events_upstream ? r->upstream : -1, .events = events_upstream},
        };
        if (r->reason != R_NONE && !events_client && !events_upstream) {
            /* Stopping, mid-frame, with nothing to wait for: cannot happen, but never hang. */
            fail(r, R_BROKEN, 0, "native relay stalled");
            return;
        }
        int ready = poll(fds, 3, timeout);
        if (ready < 0 && errno != EINTR) {
            fail(r, R_BROKEN, errno, "poll failed");
            return;
        }
        if (ready > 0 && (fds[2].revents & (POLLRDHUP | POLLHUP | POLLERR)))
            r->upstream_hup = 1;
        if (ready > 0 && (fds[0].revents & POLLIN)) {
            uint64_t value = 0;
            if (read(r->wake, &value, sizeof value) == (ssize_t)sizeof value && value >= 2) {
                r->reason = R_ABORTED;
                return;
            }
            stop(r, R_WOKEN);
        }
    }
}

/* ------------------------------------------------------------------ Python */

static PyObject *flights_list(const run_t *r)
{
    PyObject *list = PyList_New(r->count);
    if (list == NULL)
        return NULL;
    for (int i = 0; i < r->count; i++) {
        const flight_t *f = &r->ring[(r->head + i) % r->max_inflight];
        PyObject *item = Py_BuildValue("(hhiiLL)", f->api_key, f->version, f->correlation_id, f->cls,
                                       (long long)f->request_bytes, (long long)f->start_ns);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyObject *done_list(const run_t *r)
{
    PyObject *list = PyList_New(r->done_count);
    if (list == NULL)
        return NULL;
    for (int i = 0; i < r->done_count; i++) {
        const done_t *d = &r->done[i];
        PyObject *item = Py_BuildValue("(hLLL)", d->api_key, (long long)d->request_bytes,
                                       (long long)d->response_bytes, (long long)d->latency_ns);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/* The guard of a run or a peek from its two optional arguments (absent: empty). */
static guard_t guard_of(const Py_buffer *guard, const Py_buffer *known)
{
    return (guard_t){.blob = guard->buf, .len = guard->buf ? (size_t)guard->len : 0,
                     .known = known->buf, .known_len = known->buf ? (size_t)known->len : 0};
}

static PyObject *py_relay(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"client", "upstream", "wake", "classes", "flights", "max_frame", "max_inflight",
                               "slice_ms", "idle_ms", "request_pipe", "response_pipe", "guard", "known",
                               "answers", "served", NULL};
    run_t r;
    memset(&r, 0, sizeof r);
    Py_buffer classes, guard = {0}, known = {0}, served = {0};
    PyObject *flights, *answers = Py_None;
    long long slice_ms, idle_ms, max_frame;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiiy*O!LiLL(iiL)(iiL)|y*y*Oy*", keywords, &r.client,
                                     &r.upstream, &r.wake, &classes, &PyList_Type, &flights, &max_frame,
                                     &r.max_inflight, &slice_ms, &idle_ms, &r.req_pipe_r, &r.req_pipe_w,
                                     &r.req_capacity, &r.resp_pipe_r, &r.resp_pipe_w, &r.resp_capacity, &guard,
                                     &known, &answers, &served))
        return NULL;
    if (answers != Py_None && !PyObject_TypeCheck(answers, &answers_type)) {
        PyBuffer_Release(&classes);
        PyBuffer_Release(&guard);
        PyBuffer_Release(&known);
        PyBuffer_Release(&served);
        PyErr_SetString(PyExc_TypeError, "answers must be an Answers table or None");
        return NULL;
    }
    r.answers = answers == Py_None ? NULL : (answers_t *)answers;
    r.served = served.buf;
    r.served_len = served.buf ? (size_t)served.len : 0;
    r.classes = classes.buf;
    r.guard = guard_of(&guard, &known);
    r.lowat = -1;
    r.max_frame = max_frame;
    r.slice_ns = slice_ms * 1000000;
    r.idle_ns = idle_ms < 0 ? INT64_MAX : idle_ms * 1000000;
    r.reason = R_NONE;
    Py_ssize_t carried = PyList_GET_SIZE(flights);
    if (classes.len != KEYS * VERSIONS || r.max_inflight < 1 || carried > r.max_inflight) {
        PyBuffer_Release(&classes);
        PyBuffer_Release(&guard);
        PyBuffer_Release(&known);
        PyBuffer_Release(&served);
        PyErr_SetString(PyExc_ValueError, "classes must hold 128 x 32 bytes; flights at most max_inflight");
        return NULL;
    }
    r.ring = calloc((size_t)r.max_inflight, sizeof(flight_t));
    if (r.ring == NULL) {
        PyBuffer_Release(&classes);
        PyBuffer_Release(&guard);
        PyBuffer_Release(&known);
        PyBuffer_Release(&served);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < carried; i++) {
        flight_t *f = &r.ring[i];
        short api_key, version;
        int correlation_id, cls;
        long long request_bytes, start_ns;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(flights, i), "hhiiLL", &api_key, &version, &correlation_id, &cls,
                              &request_bytes, &start_ns)) {
            free(r.ring);
            PyBuffer_Release(&classes);
            PyBuffer_Release(&guard);
            PyBuffer_Release(&known);
            PyBuffer_Release(&served);
            return NULL;
        }
        f->api_key = api_key;
        f->version = version;
        f->correlation_id = correlation_id;
        f->cls = cls;
        f->request_bytes = request_bytes;
        f->start_ns = start_ns;
    }
    r.count = (int)carried;
    r.req_mover = (mover_t){.src = r.client, .dst = r.upstream, .pipe_r = r.req_pipe_r, .pipe_w = r.req_pipe_w,
                            .capacity = r.req_capacity};
    r.resp_mover = (mover_t){.src = r.upstream, .dst = r.client, .pipe_r = r.resp_pipe_r,
                             .pipe_w = r.resp_pipe_w, .capacity = r.resp_capacity};

    Py_BEGIN_ALLOW_THREADS
    run_loop(&r);
    lowat_restore(&r);
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&classes);
    PyBuffer_Release(&guard);
    PyBuffer_Release(&known);
    PyBuffer_Release(&served);
    free(r.answer_meta); /* an answer cut short (an abort, a failure) */
    PyObject *taken = PyList_New(r.taken_count);
    for (int i = 0; i < r.taken_count; i++) {
        if (taken != NULL) {
            PyObject *handle = PyLong_FromLongLong(r.taken[i]->handle);
            if (handle == NULL)
                Py_CLEAR(taken);
            else
                PyList_SET_ITEM(taken, i, handle);
        }
        answer_free(r.taken[i]);
    }
    free(r.taken);
    PyObject *held = Py_None;
    Py_INCREF(held);
    if (r.resp_state == RESP_HOLD && r.buffer != NULL) {
        Py_DECREF(held);
        if (r.ring[r.head].cls == CLASS_FETCH) /* size prefix, correlation id, top-level tagged fields */
            held = PyBytes_FromStringAndSize((const char *)r.buffer, (Py_ssize_t)r.buffer_size);
        else /* the whole response, after its size prefix */
            held = PyBytes_FromStringAndSize((const char *)r.buffer + 4, (Py_ssize_t)(r.buffer_size - 4));
    }
    free(r.buffer);
    PyObject *in_flight = held ? flights_list(&r) : NULL;
    PyObject *answered = in_flight ? done_list(&r) : NULL;
    free(r.ring);
    free(r.done);
    if (answered == NULL || taken == NULL) {
        Py_XDECREF(held);
        Py_XDECREF(in_flight);
        Py_XDECREF(answered);
        Py_XDECREF(taken);
        return NULL;
    }
    return Py_BuildValue("(iNNNLLisN)", r.reason, in_flight, answered, held, (long long)r.requests,
                         (long long)r.spliced, r.error, r.message, taken);
}

static PyObject *py_peek(PyObject *self, PyObject *args)
{
    int fd;
    Py_buffer classes, guard = {0}, known = {0}, served = {0};
    long long max_frame;
    PyObject *answers = Py_None;
    if (!PyArg_ParseTuple(args, "iy*L|y*y*Oy*", &fd, &classes, &max_frame, &guard, &known, &answers, &served))
        return NULL;
    const guard_t checks = guard_of(&guard, &known);
    int cls = CLASS_PYTHON;
    int nothing = 0;
    int bad = classes.len != KEYS * VERSIONS || (answers != Py_None && !PyObject_TypeCheck(answers, &answers_type));
    if (!bad) {
        uint8_t peek[FETCH_PEEK_MAX];
        ssize_t n = peek_request(fd, peek);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            nothing = 1;
        else if (n >= 0)
            cls = classify(peek, n, classes.buf, max_frame, &checks);
        if (n >= 12 && cls == CLASS_PYTHON && answers != Py_None && be16(peek + 4) == API_FETCH) {
            /* a key-range Fetch the table answers whole: a run starts on it too */
            int version = be16(peek + 6);
            int entry = version >= 0 && version < VERSIONS ? ((const uint8_t *)classes.buf)[API_FETCH * VERSIONS + version] : 0;
            answer_req_t q;
            if ((entry & CLASS_MASK) != CLASS_PYTHON &&
                answer_request(peek, peek + n, entry & CLASS_GUARDED, &checks, served.buf,
                               served.buf ? (size_t)served.len : 0, &q) == 0 &&
                answers_take((answers_t *)answers, &q, NULL))
                cls = entry & CLASS_MASK;
        }
    }
    PyBuffer_Release(&classes);
    PyBuffer_Release(&guard);
    PyBuffer_Release(&known);
    PyBuffer_Release(&served);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "classes must hold 128 x 32 bytes; answers an Answers table or None");
        return NULL;
    }
    if (nothing)
        Py_RETURN_NONE;
    return PyLong_FromLong(cls);
}

static PyObject *py_classify(PyObject *self, PyObject *args)
{
    Py_buffer frame, classes, guard = {0}, known = {0};
    long long max_frame;
    if (!PyArg_ParseTuple(args, "y*y*L|y*y*", &frame, &classes, &max_frame, &guard, &known))
        return NULL;
    const guard_t checks = guard_of(&guard, &known);
    int cls = -1;
    if (classes.len == KEYS * VERSIONS) {
        ssize_t span = peek_span(frame.buf, frame.len); /* as much as the loop peeks */
        cls = classify(frame.buf, frame.len < span ? frame.len : span, classes.buf, max_frame, &checks);
    }
    PyBuffer_Release(&frame);
    PyBuffer_Release(&classes);
    PyBuffer_Release(&guard);
    PyBuffer_Release(&known);
    if (cls < 0) {
        PyErr_SetString(PyExc_ValueError, "classes must hold 128 x 32 bytes");
        return NULL;
    }
    return PyLong_FromLong(cls);
}

static PyObject *py_fetch_request_plain(PyObject *self, PyObject *args)
{
    Py_buffer frame, guard = {0}, known = {0};
    int version, guarded;
    if (!PyArg_ParseTuple(args, "y*ip|y*y*", &frame, &version, &guarded, &guard, &known))
        return NULL;
    const guard_t checks = guard_of(&guard, &known);
    int plain = frame.len >= 12 ? fetch_request_plain(frame.buf, (const uint8_t *)frame.buf + frame.len, version,
                                                      guarded, &checks)
                                : -1;
    PyBuffer_Release(&frame);
    PyBuffer_Release(&guard);
    PyBuffer_Release(&known);
    return PyLong_FromLong(plain);
}

static PyObject *py_fetch_response_tail(PyObject *self, PyObject *args)
{
    Py_buffer body;
    int version;
    Py_ssize_t arriving;
    if (!PyArg_ParseTuple(args, "y*in", &body, &version, &arriving))
        return NULL;
    int64_t tail = -1;
    if (body.len >= 4 && version >= FETCH_FIRST_FLEXIBLE && arriving >= 1) {
        /* As the loop walks it: peeks of at most WALK_WINDOW bytes of what has arrived, the
         * body arriving ``arriving`` bytes at a time, and a byte more when a varint is cut. */
        fwalk_t w;
        fw_start(&w, version, body.len);
        int64_t arrived = arriving;
        while (w.state != FW_TAIL) {
            int64_t left = w.size - w.pos, n = arrived - w.pos;
            if (left == 0)
                break;
            if (n <= 0) {
                arrived = w.pos + arriving;
                continue;
            }
            n = n < left ? n : left;
            n = n < WALK_WINDOW ? n : WALK_WINDOW;
            int64_t moved = fw_walk(&w, (const uint8_t *)body.buf + w.pos, n);
            if (moved < 0)
                break;
            if (moved == 0)
                arrived = w.pos + n + 1;
        }
        if (w.state == FW_TAIL)
            tail = w.pos;
    }
    PyBuffer_Release(&body);
    if (tail < 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(tail);
}

static PyObject *py_produce_response_needs_python(PyObject *self, PyObject *args)
{
    Py_buffer body;
    int version;
    if (!PyArg_ParseTuple(args, "y*i", &body, &version))
        return NULL;
    int needs = produce_response_needs_python(body.buf, (size_t)body.len, version);
    PyBuffer_Release(&body);
    return PyBool_FromLong(needs);
}

static PyObject *py_produce_acks(PyObject *self, PyObject *args)
{
    Py_buffer frame;
    int version;
    if (!PyArg_ParseTuple(args, "y*i", &frame, &version))
        return NULL;
    int acks = frame.len >= 12 ? produce_acks(frame.buf, (const uint8_t *)frame.buf + frame.len, version) : -1000;
    PyBuffer_Release(&frame);
    if (acks == -1000)
        Py_RETURN_NONE;
    return PyLong_FromLong(acks);
}

static PyObject *py_answer_keys(PyObject *self, PyObject *args)
{
    Py_buffer frame, served, guard = {0}, known = {0};
    int guarded;
    if (!PyArg_ParseTuple(args, "y*py*|y*y*", &frame, &guarded, &served, &guard, &known))
        return NULL;
    const guard_t checks = guard_of(&guard, &known);
    answer_req_t *q = malloc(sizeof *q);
    PyObject *out = NULL;
    if (q == NULL) {
        PyErr_NoMemory();
    } else {
        int read = answer_request(frame.buf, (const uint8_t *)frame.buf + frame.len, guarded, &checks, served.buf,
                                  (size_t)served.len, q);
        if (read != 0) {
            out = PyLong_FromLong(read);
        } else if ((out = PyList_New(q->partitions)) != NULL) {
            for (int i = 0; i < q->partitions; i++) {
                PyObject *key = PyBytes_FromStringAndSize((const char *)q->key[i], q->key_len[i]);
                if (key == NULL) {
                    Py_CLEAR(out);
                    break;
                }
                PyList_SET_ITEM(out, i, key);
            }
        }
    }
    free(q);
    PyBuffer_Release(&frame);
    PyBuffer_Release(&served);
    PyBuffer_Release(&guard);
    PyBuffer_Release(&known);
    return out;
}

static PyObject *py_answer(PyObject *self, PyObject *args)
{
    Py_buffer frame, served;
    PyObject *table;
    int take = 0;
    if (!PyArg_ParseTuple(args, "y*O!y*|p", &frame, &answers_type, &table, &served, &take))
        return NULL;
    guard_t none = {0};
    answer_req_t *q = malloc(sizeof *q);
    PyObject *out = NULL;
    answer_entry *taken[ANSWER_MAX_PARTITIONS];
    if (q == NULL) {
        PyErr_NoMemory();
    } else if (answer_request(frame.buf, (const uint8_t *)frame.buf + frame.len, 0, &none, served.buf,
                              (size_t)served.len, q) != 0 || !answers_take((answers_t *)table, q, NULL)) {
        out = Py_None;
        Py_INCREF(out);
    } else {
        answers_t *t = (answers_t *)table;
        int all = 1;
        if (take) {
            all = answers_take(t, q, taken);
        } else { /* the same bytes without taking: look each up under the lock */
            pthread_mutex_lock(&t->lock);
            for (int i = 0; i < q->partitions; i++) {
                answer_entry **at = answer_find(t, q->key[i], q->key_len[i], answer_hash(q->key[i], q->key_len[i]));
                if (at == NULL) {
                    all = 0;
                    break;
                }
                taken[i] = *at;
            }
            if (!all)
                pthread_mutex_unlock(&t->lock);
        }
        if (all) {
            uint8_t *meta = malloc(answer_meta_bytes(q, taken));
            struct iovec iov[2 * ANSWER_MAX_PARTITIONS + 1];
            int64_t total = 0;
            if (meta != NULL) {
                int used = answer_iov(q, taken, meta, iov, &total);
                out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
                if (out != NULL) {
                    uint8_t *at = (uint8_t *)PyBytes_AS_STRING(out);
                    for (int i = 0; i < used; i++) {
                        memcpy(at, iov[i].iov_base, iov[i].iov_len);
                        at += iov[i].iov_len;
                    }
                }
                free(meta);
            } else {
                PyErr_NoMemory();
            }
            if (!take)
                pthread_mutex_unlock(&t->lock);
            else
                for (int i = 0; i < q->partitions; i++)
                    answer_free(taken[i]);
        } else {
            out = Py_None;
            Py_INCREF(out);
        }
    }
    free(q);
    PyBuffer_Release(&frame);
    PyBuffer_Release(&served);
    return out;
}

/* A bytearray of n bytes left as the allocator gives them: a frame buffer the socket reads
 * fill whole before anything reads it, so zeroing megabytes first is wasted work. */
static PyObject *py_unfilled_bytearray(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "negative size");
        return NULL;
    }
    return PyByteArray_FromStringAndSize(NULL, n);
}

static PyMethodDef methods[] = {
    {"unfilled_bytearray", py_unfilled_bytearray, METH_O,
     "unfilled_bytearray(n): a bytearray of n bytes not set to anything (for a buffer filled whole before use)."},
    {"relay", (PyCFunction)(void (*)(void))py_relay, METH_VARARGS | METH_KEYWORDS,
     "Relay frames between two sockets until a frame needs the interpreter (see the module's comment)."},
    {"peek", py_peek, METH_VARARGS,
     "How the loop may carry the next request on a socket (0: it may not), or None if nothing has arrived; "
     "guard, known: as relay's."},
    {"classify", py_classify, METH_VARARGS,
     "How the loop would carry a request frame (from its size prefix; its first 1 KiB as peeked, a Fetch's "
     "first 16 KiB): 0 if not; guard, known: as relay's."},
    {"fetch_request_plain", py_fetch_request_plain, METH_VARARGS,
     "fetch_request_plain(frame, version, guarded, guard=b'', known=b''): 0 when the loop may carry this Fetch "
     "request frame (from its size prefix, all of it), 1 when it is the event loop's, -1 when it does not parse."},
    {"fetch_response_tail", py_fetch_response_tail, METH_VARARGS,
     "fetch_response_tail(body, version, arriving): where the loop's walk finds the top-level tagged fields of a "
     "Fetch response body (after its size prefix) arriving that many bytes at a time, or None if malformed."},
    {"produce_response_needs_python", py_produce_response_needs_python, METH_VARARGS,
     "Whether a Produce response body (after its size prefix) has top-level tagged fields or is malformed."},
    {"answer_keys", py_answer_keys, METH_VARARGS,
     "answer_keys(frame, guarded, served, guard=b'', known=b''): the keys of a Fetch request's partitions (frame: "
     "from its size prefix, all of it) when the loop may answer it, else 1 (the event loop's) or -1 (unreadable)."},
    {"answer", py_answer, METH_VARARGS,
     "answer(frame, answers, served, take=False): the response (size prefix first) the loop sends for a Fetch "
     "request frame, or None when it would not answer it; take: take its answers out of the table."},
    {"produce_acks", py_produce_acks, METH_VARARGS,
     "The acks of a Produce request frame (from its size prefix), or None if its bytes end first."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "proxy.net._cpump",
    .m_doc = "The native relay loop for frames no feature reads.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__cpump(void)
{
    if (PyType_Ready(&answers_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&answers_type);
    if (PyModule_AddObject(m, "Answers", (PyObject *)&answers_type) < 0) {
        Py_DECREF(&answers_type);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "ANSWER_TAG", ANSWER_TAG);
    PyModule_AddIntConstant(m, "ANSWER_FIRST_VERSION", ANSWER_FIRST_VERSION);
    PyModule_AddIntConstant(m, "ANSWER_LAST_VERSION", ANSWER_LAST_VERSION);
    PyModule_AddIntConstant(m, "ANSWER_MAX_PARTITIONS", ANSWER_MAX_PARTITIONS);
    PyModule_AddIntConstant(m, "ANSWER_MAX_RANGES", ANSWER_MAX_RANGES);
    PyModule_AddIntConstant(m, "SLICE", R_SLICE);
    PyModule_AddIntConstant(m, "IDLE", R_IDLE);
    PyModule_AddIntConstant(m, "PYTHON_REQUEST", R_PYTHON_REQUEST);
    PyModule_AddIntConstant(m, "PYTHON_RESPONSE", R_PYTHON_RESPONSE);
    PyModule_AddIntConstant(m, "WOKEN", R_WOKEN);
    PyModule_AddIntConstant(m, "ABORTED", R_ABORTED);
    PyModule_AddIntConstant(m, "UPSTREAM_CLOSED", R_UPSTREAM_CLOSED);
    PyModule_AddIntConstant(m, "PROTOCOL", R_PROTOCOL);
    PyModule_AddIntConstant(m, "BROKEN", R_BROKEN);
    PyModule_AddIntConstant(m, "CLASS_PYTHON", CLASS_PYTHON);
    PyModule_AddIntConstant(m, "CLASS_OPAQUE", CLASS_OPAQUE);
    PyModule_AddIntConstant(m, "CLASS_PRODUCE", CLASS_PRODUCE);
    PyModule_AddIntConstant(m, "CLASS_FETCH", CLASS_FETCH);
    PyModule_AddIntConstant(m, "CLASS_FLEXIBLE_HEADER", CLASS_FLEXIBLE_HEADER);
    PyModule_AddIntConstant(m, "CLASS_GUARDED", CLASS_GUARDED);
    PyModule_AddIntConstant(m, "MAX_ARRAY_ELEMENTS", MAX_ARRAY_ELEMENTS);
    PyModule_AddIntConstant(m, "MAX_TAGGED_FIELDS", MAX_TAGGED_FIELDS);
    PyModule_AddIntConstant(m, "KEYS", KEYS);
    PyModule_AddIntConstant(m, "VERSIONS", VERSIONS);
    return m;
}
