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
 * xxh3 comes from the system header (Debian: libxxhash-dev) compiled inline.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

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

static PyMethodDef methods[] = {
    {"split", kern_split, METH_VARARGS, "Route records to range sets; raw bytes per set."},
    {"match", kern_match, METH_VARARGS, "Route records to range sets; offsets per set."},
    {"keep", kern_keep, METH_VARARGS, "Copy the records whose offset is in a container."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_ckernels",
    .m_doc = "C implementation of proxy.records._kernels_py (same results, much faster).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__ckernels(void) { return PyModule_Create(&module); }
