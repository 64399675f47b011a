/*
 * Optional C accelerator for the record-walking kernels of proxy/records/_kernels_py.py.
 *
 * Why: routing a record costs ~1 us in pure Python (varint decoding, slicing, a bisect and
 * an append per record); the proxy needs well over 1M records/s per core. This module walks
 * records in C with the GIL released and copies each set's records into one bytes object.
 *
 * It must give exactly the results of the Python kernels, including which inputs fail and
 * at which offset (always the start of the faulty record). So it follows the same walk,
 * including its leniency: the fast path skips the timestamp and offset delta varints by
 * their continuation bits and only insists that the key ends inside the record; anything
 * unusual (null, empty or long key) goes through the strict decoding of every field.
 *
 * split_blob runs the whole of split_records (proxy/records/split.py) over a Records blob
 * of uncompressed and control batches: entry walk, CRC checks, routing, rebuilt headers and
 * their CRCs, all without the GIL, so a fetch's split is one call a worker thread can run
 * while the event loop keeps relaying. It never raises for bad input: it returns None and
 * the Python loop, which names the fault and its offset, runs instead.
 *
 * xxh3 comes from the system header (Debian: libxxhash-dev) compiled inline.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_CRC32C_HW 1
#endif

/* ------------------------------------------------------------------ CRC32C
 * Batches carry a CRC32C (Castagnoli) that split_blob checks on the way in and writes on
 * the way out, without the GIL, so it cannot call the crc32c package. The functions below
 * update the raw register (no inversions); crc32c_value applies them as the package does. */

#define CRC32C_POLY 0x82F63B78u /* Castagnoli, bit-reflected */

/* crc_table[k][b]: the register change of byte b followed by k zero bytes (slice-by-8). */
static uint32_t crc_table[8][256];
static int crc_hw; /* the CPU has SSE4.2's crc32 instruction */

static void crc_table_setup(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int bit = 0; bit < 8; bit++)
            c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1)));
        crc_table[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (int b = 0; b < 256; b++)
            crc_table[k][b] = (crc_table[k - 1][b] >> 8) ^ crc_table[0][crc_table[k - 1][b] & 0xff];
}

static inline uint32_t load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t crc32c_table(uint32_t crc, const uint8_t *p, size_t n)
{
    for (; n >= 8; p += 8, n -= 8) {
        uint32_t lo = crc ^ load_le32(p), hi = load_le32(p + 4);
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
              crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
              crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
    }
    for (; n; p++, n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p) & 0xff];
    return crc;
}

#ifdef HAVE_CRC32C_HW
/* The crc32 instruction takes three cycles but can start one per cycle, so three streams
 * over three adjacent lanes of a chunk keep it busy. The register is linear in its start
 * value, so the first lane's register then moves past the second lane's bytes by a linear
 * map (crc_shift: four lookups), is xored with the second lane's register (started at 0),
 * and so on. Lane sizes go down so that a batch of a few KiB still gets interleaved. */
#define CRC_LANE_SIZES 3
static const size_t crc_lanes[CRC_LANE_SIZES] = {8192, 1024, 128};
/* crc_shift_table[s][k][v]: the register v << 8k after crc_lanes[s] zero bytes. */
static uint32_t crc_shift_table[CRC_LANE_SIZES][4][256];

static void crc_shift_setup(void)
{
    static const uint8_t zeros[8192];
    for (int s = 0; s < CRC_LANE_SIZES; s++) {
        uint32_t basis[32];
        for (int bit = 0; bit < 32; bit++)
            basis[bit] = crc32c_table(1u << bit, zeros, crc_lanes[s]);
        for (int k = 0; k < 4; k++)
            for (unsigned v = 0; v < 256; v++) {
                uint32_t moved = 0;
                for (int bit = 0; bit < 8; bit++)
                    if (v >> bit & 1)
                        moved ^= basis[8 * k + bit];
                crc_shift_table[s][k][v] = moved;
            }
    }
}

static inline uint32_t crc_shift(const uint32_t table[4][256], uint32_t crc)
{
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
           table[3][crc >> 24];
}

static inline uint64_t load64(const uint8_t *p)
{
    uint64_t word;
    memcpy(&word, p, 8);
    return word;
}

/* Compiled for SSE4.2 whatever the build flags; only called when the CPU says it has it. */
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *p,
                                                               size_t n)
{
    for (int s = 0; s < CRC_LANE_SIZES; s++) {
        size_t lane = crc_lanes[s];
        for (; n >= 3 * lane; p += 3 * lane, n -= 3 * lane) {
            uint64_t a = crc, b = 0, c = 0;
            for (size_t i = 0; i < lane; i += 8) {
                a = _mm_crc32_u64(a, load64(p + i));
                b = _mm_crc32_u64(b, load64(p + lane + i));
                c = _mm_crc32_u64(c, load64(p + 2 * lane + i));
            }
            crc = crc_shift(crc_shift_table[s], (uint32_t)a) ^ (uint32_t)b;
            crc = crc_shift(crc_shift_table[s], crc) ^ (uint32_t)c;
        }
    }
    uint64_t c = crc;
    for (; n >= 8; p += 8, n -= 8)
        c = _mm_crc32_u64(c, load64(p));
    crc = (uint32_t)c;
    for (; n; p++, n--)
        crc = _mm_crc32_u8(crc, *p);
    return crc;
}
#endif

static void crc32c_setup(void)
{
    crc_table_setup();
#ifdef HAVE_CRC32C_HW
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2") != 0;
    if (crc_hw)
        crc_shift_setup();
#endif
}

static uint32_t crc32c_update(uint32_t crc, const uint8_t *p, size_t n, int hw)
{
#ifdef HAVE_CRC32C_HW
    if (hw && crc_hw)
        return crc32c_sse42(crc, p, n);
#endif
    return crc32c_table(crc, p, n);
}

/* What crc32c.crc32c(data, value) returns. */
static inline uint32_t crc32c_value(uint32_t value, const uint8_t *p, size_t n)
{
    return ~crc32c_update(~value, p, n, 1);
}

#define MAX_BASE_OFFSET (INT64_MAX - ((int64_t)1 << 31))

static const char *ERR_PAST_END = "record runs past the end of the records section";
static const char *ERR_LENGTH_VARINT = "malformed record length varint";
static const char *ERR_LENGTH = "record length does not fit";
static const char *ERR_KEY = "key does not fit its record";
static const char *ERR_VARINT = "malformed varint";
static const char *ERR_VARINT_RANGE = "varint out of range";
static const char *ERR_NEG_KEY = "negative key length";

static PyObject *protocol_error = NULL;

static void raise_protocol(const char *reason, Py_ssize_t offset)
{
    if (protocol_error == NULL) {
        PyObject *mod = PyImport_ImportModule("proxy.protocol.errors");
        if (mod == NULL)
            return;
        protocol_error = PyObject_GetAttrString(mod, "ProtocolError");
        Py_DECREF(mod);
        if (protocol_error == NULL)
            return;
    }
    PyObject *args = Py_BuildValue("(s)", reason);
    PyObject *kwargs = Py_BuildValue("{s:n}", "offset", offset);
    if (args != NULL && kwargs != NULL) {
        PyObject *exc = PyObject_Call(protocol_error, args, kwargs);
        if (exc != NULL) {
            PyErr_SetObject(protocol_error, exc);
            Py_DECREF(exc);
        }
    }
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
}

static inline int64_t zigzag(uint64_t u) { return (int64_t)(u >> 1) ^ -(int64_t)(u & 1); }

/* Strict signed varint in [pos, limit): at most max_bytes (5 or 10), value in int32/int64. */
static int read_varint(const uint8_t *b, Py_ssize_t pos, Py_ssize_t limit, int max_bytes,
                       int64_t *value, Py_ssize_t *next, const char **reason)
{
    uint64_t result = 0;
    int shift = 0;
    Py_ssize_t stop = (limit - pos > max_bytes) ? pos + max_bytes : limit;
    for (Py_ssize_t p = pos; p < stop; p++) {
        uint8_t byte = b[p];
        uint64_t bits = byte & 0x7f;
        if (shift == 63 && bits > 1) {
            /* A 10th byte above 1 overflows 64 bits: out of range if the varint ends here,
             * malformed (too long) if it does not; this is the last byte either way. */
            *reason = byte < 0x80 ? ERR_VARINT_RANGE : ERR_VARINT;
            return -1;
        }
        result |= bits << shift;
        if (byte < 0x80) {
            if (max_bytes == 5 && (result >> 32) != 0) {
                *reason = ERR_VARINT_RANGE;
                return -1;
            }
            *value = zigzag(result);
            *next = p + 1;
            return 0;
        }
        shift += 7;
    }
    *reason = ERR_VARINT;
    return -1;
}

/* Unsigned record length: at most 5 bytes, bounded by the section end. */
static int read_uvarint(const uint8_t *b, Py_ssize_t pos, Py_ssize_t end, uint64_t *value,
                        Py_ssize_t *next)
{
    uint64_t result = 0;
    int shift = 0;
    Py_ssize_t stop = (end - pos > 5) ? pos + 5 : end;
    for (Py_ssize_t p = pos; p < stop; p++) {
        uint8_t byte = b[p];
        result |= (uint64_t)(byte & 0x7f) << shift;
        if (byte < 0x80) {
            *value = result;
            *next = p + 1;
            return 0;
        }
        shift += 7;
    }
    return -1;
}

static inline uint64_t hash_offset(int64_t offset)
{
    uint8_t be[8];
    uint64_t v = (uint64_t)offset;
    for (int i = 7; i >= 0; i--) {
        be[i] = (uint8_t)(v & 0xff);
        v >>= 8;
    }
    return XXH3_64bits(be, 8) >> 1;
}

typedef struct {
    const uint8_t *b;
    Py_ssize_t len; /* whole buffer: how far the lenient skips may look */
    Py_ssize_t end; /* end of the records section */
    int64_t base;
} walker;

/* Record framing at *pos: sets *body (attributes byte) and *rec_end. */
static int frame(const walker *w, Py_ssize_t pos, Py_ssize_t *body, Py_ssize_t *rec_end,
                 const char **reason)
{
    const uint8_t *b = w->b;
    uint64_t u = b[pos];
    if (u < 0x80) {
        pos += 1;
    } else {
        if (pos + 1 >= w->len) {
            *reason = ERR_PAST_END;
            return -1;
        }
        if (b[pos + 1] < 0x80) {
            u = (u & 0x7f) | ((uint64_t)b[pos + 1] << 7);
            pos += 2;
        } else if (read_uvarint(b, pos, w->end, &u, &pos) < 0) {
            *reason = ERR_LENGTH_VARINT;
            return -1;
        }
    }
    int64_t length = zigzag(u);
    if (length < 1 || length > w->end - pos) {
        *reason = ERR_LENGTH;
        return -1;
    }
    *body = pos;
    *rec_end = pos + length;
    return 0;
}

/* Strict route: decode timestamp delta, offset delta, key length; hash key or offset. */
static int route_strict(const walker *w, Py_ssize_t pos, Py_ssize_t rec_end, uint64_t *hash,
                        int64_t *delta, const char **reason)
{
    int64_t ts, od, kl;
    if (read_varint(w->b, pos + 1, rec_end, 10, &ts, &pos, reason) < 0)
        return -1;
    if (read_varint(w->b, pos, rec_end, 5, &od, &pos, reason) < 0)
        return -1;
    if (read_varint(w->b, pos, rec_end, 5, &kl, &pos, reason) < 0)
        return -1;
    if (kl >= 0) {
        if (kl > rec_end - pos) {
            *reason = ERR_KEY;
            return -1;
        }
        *hash = XXH3_64bits(w->b + pos, (size_t)kl) >> 1;
    } else if (kl == -1) {
        *hash = hash_offset(w->base + od);
    } else {
        *reason = ERR_NEG_KEY;
        return -1;
    }
    *delta = od;
    return 0;
}

/* Route the record whose attributes byte is at body: the same walk as the Python kernels. */
static int route(const walker *w, Py_ssize_t body, Py_ssize_t rec_end, int want_delta,
                 uint64_t *hash, int64_t *delta, const char **reason)
{
    const uint8_t *b = w->b;
    Py_ssize_t p = body + 1;
    for (;;) {
        if (p >= w->len) {
            *reason = ERR_PAST_END;
            return -1;
        }
        if (b[p] <= 0x7f)
            break;
        p++;
    }
    p++;
    Py_ssize_t od_pos = p;
    for (;;) {
        if (p >= w->len) {
            *reason = ERR_PAST_END;
            return -1;
        }
        if (b[p] <= 0x7f)
            break;
        p++;
    }
    p++;
    if (p >= w->len) {
        *reason = ERR_PAST_END;
        return -1;
    }
    uint8_t kl = b[p];
    if (kl > 1 && kl < 0x80 && !(kl & 1)) {
        p++;
        Py_ssize_t key_len = kl >> 1;
        if (p + key_len > rec_end) {
            *reason = ERR_KEY;
            return -1;
        }
        *hash = XXH3_64bits(b + p, (size_t)key_len) >> 1;
        if (want_delta) {
            if (p - od_pos == 2) {
                *delta = zigzag(b[od_pos]);
            } else {
                Py_ssize_t ignored;
                if (read_varint(b, od_pos, rec_end, 5, delta, &ignored, reason) < 0)
                    return -1;
            }
        }
        return 0;
    }
    int64_t od;
    if (route_strict(w, body, rec_end, hash, &od, reason) < 0)
        return -1;
    *delta = od;
    return 0;
}

static inline Py_ssize_t find_slot(const uint64_t *bounds, Py_ssize_t n, uint64_t h)
{
    /* bisect_right: first index whose bound exceeds h */
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        if (bounds[mid] <= h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

typedef struct {
    uint64_t *bounds;
    Py_ssize_t nbounds;
    Py_ssize_t *mem_off; /* nbounds + 2 entries */
    Py_ssize_t *mem_idx;
    Py_ssize_t nsets;
} plan_t;

static void plan_free(plan_t *plan)
{
    PyMem_Free(plan->bounds);
    PyMem_Free(plan->mem_off);
    PyMem_Free(plan->mem_idx);
}

static int plan_load(PyObject *bounds_obj, PyObject *members_obj, Py_ssize_t nsets, plan_t *plan)
{
    memset(plan, 0, sizeof(*plan));
    plan->nsets = nsets;
    if (nsets < 0) {
        PyErr_SetString(PyExc_ValueError, "negative set count");
        return -1;
    }
    PyObject *bounds = PySequence_Fast(bounds_obj, "bounds must be a sequence");
    if (bounds == NULL)
        return -1;
    PyObject *members = PySequence_Fast(members_obj, "members must be a sequence");
    if (members == NULL) {
        Py_DECREF(bounds);
        return -1;
    }
    Py_ssize_t nb = PySequence_Fast_GET_SIZE(bounds);
    if (PySequence_Fast_GET_SIZE(members) != nb + 1) {
        PyErr_SetString(PyExc_ValueError, "members must have len(bounds) + 1 entries");
        goto fail;
    }
    plan->nbounds = nb;
    plan->bounds = PyMem_Malloc(sizeof(uint64_t) * (size_t)(nb ? nb : 1));
    plan->mem_off = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(nb + 2));
    if (plan->bounds == NULL || plan->mem_off == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < nb; i++) {
        uint64_t v = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(bounds, i));
        if (v == (uint64_t)-1 && PyErr_Occurred())
            goto fail;
        plan->bounds[i] = v;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i <= nb; i++) {
        Py_ssize_t n = PyObject_Length(PySequence_Fast_GET_ITEM(members, i));
        if (n < 0)
            goto fail;
        plan->mem_off[i] = total;
        total += n;
    }
    plan->mem_off[nb + 1] = total;
    plan->mem_idx = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(total ? total : 1));
    if (plan->mem_idx == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i <= nb; i++) {
        PyObject *m = PySequence_Fast(PySequence_Fast_GET_ITEM(members, i), "member entry");
        if (m == NULL)
            goto fail;
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(m); j++) {
            Py_ssize_t k = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(m, j));
            if (k == -1 && PyErr_Occurred()) {
                Py_DECREF(m);
                goto fail;
            }
            if (k < 0 || k >= nsets) {
                Py_DECREF(m);
                PyErr_SetString(PyExc_ValueError, "member index out of range");
                goto fail;
            }
            plan->mem_idx[plan->mem_off[i] + j] = k;
        }
        Py_DECREF(m);
    }
    Py_DECREF(bounds);
    Py_DECREF(members);
    return 0;
fail:
    Py_DECREF(bounds);
    Py_DECREF(members);
    plan_free(plan);
    return -1;
}

static int check_span(Py_buffer *view, Py_ssize_t start, Py_ssize_t end, long long base)
{
    if (start < 0 || end < start || end > view->len) {
        PyErr_SetString(PyExc_ValueError, "start/end outside the buffer");
        return -1;
    }
    if (base < 0 || base > MAX_BASE_OFFSET) {
        raise_protocol("base offset out of range", start);
        return -1;
    }
    return 0;
}

typedef struct {
    Py_ssize_t start;
    Py_ssize_t len;
    Py_ssize_t slot;
    int64_t offset;
} rec_t;

typedef struct {
    rec_t *items;
    Py_ssize_t n, cap;
} rec_vec;

static int vec_push(rec_vec *v, rec_t r)
{
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap ? v->cap * 2 : 256;
        rec_t *items = realloc(v->items, sizeof(rec_t) * (size_t)cap);
        if (items == NULL)
            return -1;
        v->items = items;
        v->cap = cap;
    }
    v->items[v->n++] = r;
    return 0;
}

/* Walk every record in [start, end) without the GIL. want_delta fills rec_t.offset.
 * Returns 0; -1 with *reason and *fault set; -2 out of memory. */
static int walk_all(const walker *w, Py_ssize_t start, const plan_t *plan, int want_delta,
                    rec_vec *out, const char **reason, Py_ssize_t *fault)
{
    Py_ssize_t pos = start;
    while (pos < w->end) {
        Py_ssize_t body, rec_end;
        uint64_t h = 0;
        int64_t delta = 0;
        if (frame(w, pos, &body, &rec_end, reason) < 0 ||
            route(w, body, rec_end, want_delta, &h, &delta, reason) < 0) {
            *fault = pos;
            return -1;
        }
        rec_t r = {pos, rec_end - pos, find_slot(plan->bounds, plan->nbounds, h),
                   w->base + delta};
        if (vec_push(out, r) < 0)
            return -2;
        pos = rec_end;
    }
    return 0;
}

static int walk_or_raise(const walker *w, Py_ssize_t start, const plan_t *plan, int want_delta,
                         rec_vec *recs)
{
    const char *reason = NULL;
    Py_ssize_t fault = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = walk_all(w, start, plan, want_delta, recs, &reason, &fault);
    Py_END_ALLOW_THREADS
    if (rc == -1)
        raise_protocol(reason, fault);
    else if (rc == -2)
        PyErr_NoMemory();
    return rc;
}

/* split(buf, start, end, base_offset, bounds, members, nsets)
 *   -> (list[bytes] per set, list[int] counts per set, total) */
static PyObject *kern_split(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end, nsets;
    long long base;
    PyObject *bounds_obj, *members_obj;
    if (!PyArg_ParseTuple(args, "y*nnLOOn", &view, &start, &end, &base, &bounds_obj,
                          &members_obj, &nsets))
        return NULL;
    PyObject *result = NULL, *outs = NULL, *counts = NULL;
    Py_ssize_t *sizes = NULL, *nrec = NULL;
    char **dst = NULL;
    rec_vec recs = {NULL, 0, 0};
    plan_t plan;
    if (check_span(&view, start, end, base) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (plan_load(bounds_obj, members_obj, nsets, &plan) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    walker w = {(const uint8_t *)view.buf, view.len, end, (int64_t)base};
    if (walk_or_raise(&w, start, &plan, 0, &recs) < 0)
        goto done;

    sizes = PyMem_Calloc((size_t)(nsets ? nsets : 1), sizeof(Py_ssize_t));
    nrec = PyMem_Calloc((size_t)(nsets ? nsets : 1), sizeof(Py_ssize_t));
    dst = PyMem_Calloc((size_t)(nsets ? nsets : 1), sizeof(char *));
    if (sizes == NULL || nrec == NULL || dst == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < recs.n; i++) {
        const rec_t *r = &recs.items[i];
        for (Py_ssize_t j = plan.mem_off[r->slot]; j < plan.mem_off[r->slot + 1]; j++) {
            sizes[plan.mem_idx[j]] += r->len;
            nrec[plan.mem_idx[j]] += 1;
        }
    }
    outs = PyList_New(nsets);
    counts = PyList_New(nsets);
    if (outs == NULL || counts == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < nsets; k++) {
        PyObject *bytes = PyBytes_FromStringAndSize(NULL, sizes[k]);
        if (bytes == NULL)
            goto done;
        PyList_SET_ITEM(outs, k, bytes);
        dst[k] = PyBytes_AS_STRING(bytes);
        PyObject *c = PyLong_FromSsize_t(nrec[k]);
        if (c == NULL)
            goto done;
        PyList_SET_ITEM(counts, k, c);
    }
    for (Py_ssize_t i = 0; i < recs.n; i++) {
        const rec_t *r = &recs.items[i];
        for (Py_ssize_t j = plan.mem_off[r->slot]; j < plan.mem_off[r->slot + 1]; j++) {
            Py_ssize_t k = plan.mem_idx[j];
            memcpy(dst[k], w.b + r->start, (size_t)r->len);
            dst[k] += r->len;
        }
    }
    result = Py_BuildValue("(OOn)", outs, counts, recs.n);
done:
    Py_XDECREF(outs);
    Py_XDECREF(counts);
    PyMem_Free(sizes);
    PyMem_Free(nrec);
    PyMem_Free(dst);
    free(recs.items);
    plan_free(&plan);
    PyBuffer_Release(&view);
    return result;
}

/* match(buf, start, end, base_offset, bounds, members, nsets)
 *   -> (list[list[int]] absolute offsets per set, total) */
static PyObject *kern_match(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end, nsets;
    long long base;
    PyObject *bounds_obj, *members_obj;
    if (!PyArg_ParseTuple(args, "y*nnLOOn", &view, &start, &end, &base, &bounds_obj,
                          &members_obj, &nsets))
        return NULL;
    PyObject *result = NULL, *outs = NULL;
    rec_vec recs = {NULL, 0, 0};
    plan_t plan;
    if (check_span(&view, start, end, base) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (plan_load(bounds_obj, members_obj, nsets, &plan) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    walker w = {(const uint8_t *)view.buf, view.len, end, (int64_t)base};
    if (walk_or_raise(&w, start, &plan, 1, &recs) < 0)
        goto done;
    outs = PyList_New(nsets);
    if (outs == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < nsets; k++) {
        PyObject *l = PyList_New(0);
        if (l == NULL)
            goto done;
        PyList_SET_ITEM(outs, k, l);
    }
    for (Py_ssize_t i = 0; i < recs.n; i++) {
        const rec_t *r = &recs.items[i];
        for (Py_ssize_t j = plan.mem_off[r->slot]; j < plan.mem_off[r->slot + 1]; j++) {
            PyObject *o = PyLong_FromLongLong(r->offset);
            if (o == NULL)
                goto done;
            int rc = PyList_Append(PyList_GET_ITEM(outs, plan.mem_idx[j]), o);
            Py_DECREF(o);
            if (rc < 0)
                goto done;
        }
    }
    result = Py_BuildValue("(On)", outs, recs.n);
done:
    Py_XDECREF(outs);
    free(recs.items);
    plan_free(&plan);
    PyBuffer_Release(&view);
    return result;
}

/* Offset delta of a framed record, strictly decoded (as Python's _offset_delta). */
static int offset_delta(const walker *w, Py_ssize_t body, Py_ssize_t rec_end, int64_t *delta,
                        const char **reason)
{
    int64_t ts;
    Py_ssize_t pos;
    if (read_varint(w->b, body + 1, rec_end, 10, &ts, &pos, reason) < 0)
        return -1;
    return read_varint(w->b, pos, rec_end, 5, delta, &pos, reason);
}

/* keep(buf, start, end, base_offset, offsets) -> (bytes, kept, total) */
static PyObject *kern_keep(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end;
    long long base;
    PyObject *offsets;
    if (!PyArg_ParseTuple(args, "y*nnLO", &view, &start, &end, &base, &offsets))
        return NULL;
    PyObject *result = NULL;
    rec_vec recs = {NULL, 0, 0};
    if (check_span(&view, start, end, base) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    walker w = {(const uint8_t *)view.buf, view.len, end, (int64_t)base};
    Py_ssize_t pos = start, total = 0, size = 0;
    while (pos < end) {
        Py_ssize_t body, rec_end;
        int64_t delta;
        const char *reason = NULL;
        if (frame(&w, pos, &body, &rec_end, &reason) < 0 ||
            offset_delta(&w, body, rec_end, &delta, &reason) < 0) {
            raise_protocol(reason, pos);
            goto done;
        }
        PyObject *o = PyLong_FromLongLong(w.base + delta);
        if (o == NULL)
            goto done;
        int hit = PySequence_Contains(offsets, o);
        Py_DECREF(o);
        if (hit < 0)
            goto done;
        if (hit) {
            rec_t r = {pos, rec_end - pos, 0, 0};
            if (vec_push(&recs, r) < 0) {
                PyErr_NoMemory();
                goto done;
            }
            size += rec_end - pos;
        }
        total++;
        pos = rec_end;
    }
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, size);
    if (bytes == NULL)
        goto done;
    char *dst = PyBytes_AS_STRING(bytes);
    for (Py_ssize_t i = 0; i < recs.n; i++) {
        memcpy(dst, w.b + recs.items[i].start, (size_t)recs.items[i].len);
        dst += recs.items[i].len;
    }
    result = Py_BuildValue("(Nnn)", bytes, recs.n, total);
done:
    free(recs.items);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------ split_blob
 * The Python loop of split_records, over a blob whose complete entries are all v2 batches
 * that are uncompressed or control batches. Layout offsets are those of batch.py. */

#define LOG_OVERHEAD 12
#define MIN_ENTRY_LENGTH 14
#define MAGIC_AT 16
#define CRC_AT 17
#define ATTRIBUTES_AT 21
#define LAST_DELTA_AT 23
#define COUNT_AT 57
#define HEADER_SIZE 61
#define CODEC_MASK 0x07
#define MAX_CODEC 4
#define CONTROL_BIT 0x20
/* The fewest bytes of a record the walk accepts: a length varint, then the attributes,
 * timestamp delta, offset delta and key length bytes, all inside the record (route). A
 * batch's declared record count sizes the routed array, so it is first held to what its
 * bytes can hold: a count, like any other a peer declares, must never size an allocation
 * beyond what the bytes that came with it can fill. */
#define MIN_WALKED_RECORD 5

static inline uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline int64_t be64(const uint8_t *p)
{
    return (int64_t)((uint64_t)be32(p) << 32 | be32(p + 4));
}

static inline void put_be32(char *p, uint32_t v)
{
    p[0] = (char)(v >> 24);
    p[1] = (char)(v >> 16);
    p[2] = (char)(v >> 8);
    p[3] = (char)v;
}

enum entry_kind {
    ENTRY_CONTROL, /* forwarded unchanged, not counted as a data batch */
    ENTRY_WHOLE,   /* every set is full: forwarded unchanged without walking its records */
    ENTRY_WALK,    /* routed record by record */
};

typedef struct {
    Py_ssize_t pos, size;
    Py_ssize_t first; /* ENTRY_WALK: its first record in the routed array */
    Py_ssize_t total; /* data batches: its records (declared ones for ENTRY_WHOLE) */
    enum entry_kind kind;
} entry_t;

/* One walked record: its length (prefix included) and the plan slot its key hash falls in.
 * Records of a batch are contiguous, so lengths alone place them. */
typedef struct {
    uint32_t len, slot;
} routed_t;

typedef struct {
    const uint8_t *b;
    Py_ssize_t n;
    const plan_t *plan;
    int all_full, verify;
    entry_t *entries; /* malloc'd, sized by the first scan */
    Py_ssize_t nentries;
    routed_t *recs; /* malloc'd, sized by the declared counts of the batches to walk (bounded by their bytes) */
    Py_ssize_t nrecs;
    Py_ssize_t partial;
    int64_t next_offset;
    int has_next;
    /* per set (PyMem, nsets each) */
    Py_ssize_t *size, *kept, *empties, *tally_kept, *tally_bytes;
    char **dst, **hdr;
    /* shared by every set */
    Py_ssize_t controls, batches, records;
} blob_split;

/* The entries as iter_batches and parse_header read them. -1 wherever either would raise,
 * and for what split_blob leaves to Python: magic 0/1 entries and compressed data batches.
 * With entries NULL it only counts, for sizing the arrays the second scan fills; that one
 * stops at those sizes (cap_entries, cap_recs) should the blob read differently now. */
static int scan_entries(blob_split *s, entry_t *entries, Py_ssize_t cap_entries,
                        Py_ssize_t cap_recs, Py_ssize_t *nentries, Py_ssize_t *nrecs)
{
    const uint8_t *b = s->b;
    Py_ssize_t pos = 0, count = 0, records = 0;
    s->has_next = 0;
    while (pos < s->n) {
        Py_ssize_t remaining = s->n - pos;
        if (remaining < LOG_OVERHEAD)
            break;
        int32_t length = (int32_t)be32(b + pos + 8);
        if (length < MIN_ENTRY_LENGTH)
            return -1;
        if (remaining <= MAGIC_AT)
            break;
        uint8_t magic = b[pos + MAGIC_AT];
        if (magic > 2 || (magic == 2 && length < HEADER_SIZE - LOG_OVERHEAD))
            return -1;
        Py_ssize_t size = LOG_OVERHEAD + (Py_ssize_t)length;
        if (size > remaining)
            break;
        if (magic != 2)
            return -1;
        const uint8_t *h = b + pos;
        int32_t declared = (int32_t)be32(h + COUNT_AT);
        int32_t last_delta = (int32_t)be32(h + LAST_DELTA_AT);
        unsigned attributes = (unsigned)h[ATTRIBUTES_AT] << 8 | h[ATTRIBUTES_AT + 1];
        unsigned codec = attributes & CODEC_MASK;
        int control = (attributes & CONTROL_BIT) != 0;
        int64_t base = be64(h);
        if (declared < 0 || last_delta < 0 || codec > MAX_CODEC || (!control && codec != 0))
            return -1;
        if (base > INT64_MAX - 1 - last_delta) /* next_offset would not fit an int64 */
            return -1;
        enum entry_kind kind = control ? ENTRY_CONTROL : s->all_full ? ENTRY_WHOLE : ENTRY_WALK;
        if (kind == ENTRY_WALK) {
            /* A record takes at least MIN_WALKED_RECORD bytes: a larger count cannot be met. */
            if (base < 0 || base > MAX_BASE_OFFSET || declared > (size - HEADER_SIZE) / MIN_WALKED_RECORD)
                return -1;
        }
        if (entries != NULL) {
            if (count == cap_entries || (kind == ENTRY_WALK && declared > cap_recs - records))
                return -1;
            entry_t *e = &entries[count];
            e->pos = pos;
            e->size = size;
            e->kind = kind;
            e->first = records;
            e->total = declared;
        }
        if (kind == ENTRY_WALK)
            records += declared;
        count++;
        s->next_offset = base + last_delta + 1;
        s->has_next = 1;
        pos += size;
    }
    s->partial = s->n - pos;
    *nentries = count;
    *nrecs = records;
    return 0;
}

/* Route the records of a batch into s->recs from e->first; -1 on any fault of the walk or
 * a count other than the declared one (the kernels' and _check_count's errors). */
static int walk_batch(const blob_split *s, entry_t *e)
{
    const plan_t *plan = s->plan;
    walker w = {s->b, s->n, e->pos + e->size, be64(s->b + e->pos)};
    routed_t *out = s->recs + e->first;
    Py_ssize_t declared = e->total, found = 0, pos = e->pos + HEADER_SIZE;
    while (pos < w.end) {
        Py_ssize_t body, rec_end;
        uint64_t h = 0;
        int64_t delta = 0;
        const char *reason;
        if (found == declared || frame(&w, pos, &body, &rec_end, &reason) < 0 ||
            route(&w, body, rec_end, 0, &h, &delta, &reason) < 0)
            return -1;
        out[found].len = (uint32_t)(rec_end - pos);
        out[found].slot = (uint32_t)find_slot(plan->bounds, plan->nbounds, h);
        found++;
        pos = rec_end;
    }
    return found == declared ? 0 : -1;
}

/* How many records, and how many of their bytes, each set keeps of a walked batch. */
static void tally(const blob_split *s, const entry_t *e)
{
    const plan_t *plan = s->plan;
    memset(s->tally_kept, 0, sizeof(Py_ssize_t) * (size_t)plan->nsets);
    memset(s->tally_bytes, 0, sizeof(Py_ssize_t) * (size_t)plan->nsets);
    const routed_t *r = s->recs + e->first;
    for (Py_ssize_t i = 0; i < e->total; i++) {
        for (Py_ssize_t j = plan->mem_off[r[i].slot]; j < plan->mem_off[r[i].slot + 1]; j++) {
            Py_ssize_t k = plan->mem_idx[j];
            s->tally_kept[k] += 1;
            s->tally_bytes[k] += r[i].len;
        }
    }
}

/* First pass, without the GIL: scan, check CRCs, route every record and size every output.
 * 0; -1 for input left to Python; -2 out of memory. Scratch stays in s for the caller. */
static int split_plan(blob_split *s)
{
    Py_ssize_t nentries, nrecs;
    if (scan_entries(s, NULL, 0, 0, &nentries, &nrecs) < 0)
        return -1;
    s->entries = malloc(sizeof(entry_t) * (size_t)(nentries ? nentries : 1));
    s->recs = malloc(sizeof(routed_t) * (size_t)(nrecs ? nrecs : 1));
    if (s->entries == NULL || s->recs == NULL)
        return -2;
    if (scan_entries(s, s->entries, nentries, nrecs, &s->nentries, &s->nrecs) < 0)
        return -1;
    Py_ssize_t nsets = s->plan->nsets;
    for (Py_ssize_t i = 0; i < s->nentries; i++) {
        entry_t *e = &s->entries[i];
        const uint8_t *h = s->b + e->pos;
        if (s->verify && crc32c_value(0, h + ATTRIBUTES_AT, (size_t)(e->size - ATTRIBUTES_AT)) !=
                             be32(h + CRC_AT))
            return -1;
        if (e->kind == ENTRY_CONTROL) {
            s->controls++;
            for (Py_ssize_t k = 0; k < nsets; k++)
                s->size[k] += e->size;
            continue;
        }
        if (e->kind == ENTRY_WALK && walk_batch(s, e) < 0)
            return -1;
        s->batches++;
        s->records += e->total;
        if (e->kind == ENTRY_WHOLE) {
            for (Py_ssize_t k = 0; k < nsets; k++) {
                s->size[k] += e->size;
                s->kept[k] += e->total;
            }
            continue;
        }
        tally(s, e);
        for (Py_ssize_t k = 0; k < nsets; k++) {
            Py_ssize_t kept = s->tally_kept[k];
            s->size[k] += kept == e->total ? e->size : HEADER_SIZE + s->tally_bytes[k];
            s->kept[k] += kept;
            s->empties[k] += kept == 0 && e->total;
        }
    }
    return 0;
}

/* A rebuilt batch at hdr, records already in place: the source's header with the batch
 * length, record count and CRC of the copy (attributes stay: the source is uncompressed). */
static void seal(char *hdr, const uint8_t *source, Py_ssize_t size, Py_ssize_t kept)
{
    memcpy(hdr, source, HEADER_SIZE);
    put_be32(hdr + 8, (uint32_t)(size - LOG_OVERHEAD));
    put_be32(hdr + COUNT_AT, (uint32_t)kept);
    const uint8_t *covered = (const uint8_t *)hdr + ATTRIBUTES_AT;
    put_be32(hdr + CRC_AT, crc32c_value(0, covered, (size_t)(size - ATTRIBUTES_AT)));
}

/* Second pass, without the GIL: fill the outputs s->dst points into. Every size comes from
 * the scratch of the first pass, never from the blob again, so the writes stay within what
 * that pass counted even if someone changed the buffer meanwhile. */
static void split_fill(blob_split *s)
{
    const plan_t *plan = s->plan;
    Py_ssize_t nsets = plan->nsets;
    for (Py_ssize_t i = 0; i < s->nentries; i++) {
        const entry_t *e = &s->entries[i];
        const uint8_t *source = s->b + e->pos;
        if (e->kind != ENTRY_WALK) {
            for (Py_ssize_t k = 0; k < nsets; k++) {
                memcpy(s->dst[k], source, (size_t)e->size);
                s->dst[k] += e->size;
            }
            continue;
        }
        tally(s, e);
        for (Py_ssize_t k = 0; k < nsets; k++) {
            if (s->tally_kept[k] == e->total) { /* the whole batch: its bytes unchanged */
                memcpy(s->dst[k], source, (size_t)e->size);
                s->dst[k] += e->size;
                s->hdr[k] = NULL;
            } else {
                s->hdr[k] = s->dst[k];
                s->dst[k] += HEADER_SIZE;
            }
        }
        const routed_t *r = s->recs + e->first;
        const uint8_t *rec = source + HEADER_SIZE;
        for (Py_ssize_t n = 0; n < e->total; n++) {
            for (Py_ssize_t j = plan->mem_off[r[n].slot]; j < plan->mem_off[r[n].slot + 1]; j++) {
                Py_ssize_t k = plan->mem_idx[j];
                if (s->hdr[k] != NULL) {
                    memcpy(s->dst[k], rec, r[n].len);
                    s->dst[k] += r[n].len;
                }
            }
            rec += r[n].len;
        }
        for (Py_ssize_t k = 0; k < nsets; k++)
            if (s->hdr[k] != NULL)
                seal(s->hdr[k], source, s->dst[k] - s->hdr[k], s->tally_kept[k]);
    }
}

static PyObject *list_of_sizes(const Py_ssize_t *values, Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    for (Py_ssize_t k = 0; list != NULL && k < n; k++) {
        PyObject *v = PyLong_FromSsize_t(values[k]);
        if (v == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, k, v);
    }
    return list;
}

/* The output bytes, allocated at their exact sizes (with the GIL), then filled without it. */
static PyObject *split_outputs(blob_split *s)
{
    Py_ssize_t nsets = s->plan->nsets;
    PyObject *outs = PyList_New(nsets);
    if (outs == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < nsets; k++) {
        PyObject *bytes = PyBytes_FromStringAndSize(NULL, s->size[k]);
        if (bytes == NULL) {
            Py_DECREF(outs);
            return NULL;
        }
        PyList_SET_ITEM(outs, k, bytes);
        s->dst[k] = PyBytes_AS_STRING(bytes);
    }
    Py_BEGIN_ALLOW_THREADS
    split_fill(s);
    Py_END_ALLOW_THREADS
    return outs;
}

static PyObject *split_result(blob_split *s)
{
    Py_ssize_t nsets = s->plan->nsets;
    PyObject *outs = split_outputs(s);
    PyObject *kept = list_of_sizes(s->kept, nsets);
    PyObject *empties = list_of_sizes(s->empties, nsets);
    PyObject *next = s->has_next ? PyLong_FromLongLong(s->next_offset) : Py_NewRef(Py_None);
    if (outs == NULL || kept == NULL || empties == NULL || next == NULL) {
        Py_XDECREF(outs);
        Py_XDECREF(kept);
        Py_XDECREF(empties);
        Py_XDECREF(next);
        return NULL;
    }
    return Py_BuildValue("(NNNnnnnN)", outs, kept, empties, s->controls, s->batches,
                         s->records, s->partial, next);
}

/* split_blob(blob, bounds, members, nsets, all_full, verify_crc)
 *   -> (list[bytes] per set, list[int] records kept per set, list[int] emptied batches per
 *       set, control batches, data batches, data records, partial bytes, next offset or None)
 *   or None when the blob holds anything but complete uncompressed or control v2 batches
 *   (and a partial tail), is malformed in any way split_records would raise for, or nsets
 *   is 0. all_full: every set is the whole hash space (RangePlan.full_sets), so data
 *   batches go to every set unchanged without walking their records, as in split_records. */
static PyObject *kern_split_blob(PyObject *self, PyObject *args)
{
    Py_buffer view;
    PyObject *bounds_obj, *members_obj;
    Py_ssize_t nsets;
    int all_full, verify;
    if (!PyArg_ParseTuple(args, "y*OOnpp", &view, &bounds_obj, &members_obj, &nsets, &all_full,
                          &verify))
        return NULL;
    if (nsets == 0) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    plan_t plan;
    if (plan_load(bounds_obj, members_obj, nsets, &plan) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    PyObject *result = NULL;
    blob_split s;
    memset(&s, 0, sizeof(s));
    s.b = (const uint8_t *)view.buf;
    s.n = view.len;
    s.plan = &plan;
    s.all_full = all_full;
    s.verify = verify;
    Py_ssize_t *counters = PyMem_Calloc((size_t)nsets * 5, sizeof(Py_ssize_t));
    char **cursors = PyMem_Calloc((size_t)nsets * 2, sizeof(char *));
    if (counters == NULL || cursors == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    s.size = counters;
    s.kept = counters + nsets;
    s.empties = counters + 2 * nsets;
    s.tally_kept = counters + 3 * nsets;
    s.tally_bytes = counters + 4 * nsets;
    s.dst = cursors;
    s.hdr = cursors + nsets;
    if (plan.nbounds >= (Py_ssize_t)UINT32_MAX) { /* slots would not fit routed_t */
        result = Py_NewRef(Py_None);
        goto done;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = split_plan(&s);
    Py_END_ALLOW_THREADS
    if (rc == -2)
        PyErr_NoMemory();
    else if (rc == -1)
        result = Py_NewRef(Py_None);
    else
        result = split_result(&s);
done:
    free(s.entries);
    free(s.recs);
    PyMem_Free(counters);
    PyMem_Free(cursors);
    plan_free(&plan);
    PyBuffer_Release(&view);
    return result;
}

/* crc32c(data, value=0, hardware=True): the crc32c package's crc32c(data, value), computed
 * by split_blob's code; hardware=False takes the table path even on an SSE4.2 CPU, so tests
 * cover both. */
static PyObject *kern_crc32c(PyObject *self, PyObject *args)
{
    Py_buffer view;
    unsigned int value = 0;
    int hardware = 1;
    if (!PyArg_ParseTuple(args, "y*|Ip", &view, &value, &hardware))
        return NULL;
    uint32_t crc = ~crc32c_update(~(uint32_t)value, view.buf, (size_t)view.len, hardware);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"split", kern_split, METH_VARARGS, "Route records to range sets; raw bytes per set."},
    {"match", kern_match, METH_VARARGS, "Route records to range sets; offsets per set."},
    {"keep", kern_keep, METH_VARARGS, "Copy the records whose offset is in a container."},
    {"split_blob", kern_split_blob, METH_VARARGS,
     "split_records over a blob of uncompressed and control batches, without the GIL; None "
     "for anything else."},
    {"crc32c", kern_crc32c, METH_VARARGS, "CRC32C as the crc32c package computes it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_ckernels",
    .m_doc = "C implementation of proxy.records._kernels_py (same results, much faster), and "
             "split_blob: split_records over a whole blob without the GIL.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__ckernels(void)
{
    crc32c_setup();
    PyObject *mod = PyModule_Create(&module);
    if (mod != NULL && PyModule_AddIntConstant(mod, "CRC32C_HARDWARE", crc_hw) < 0)
        Py_CLEAR(mod);
    return mod;
}
