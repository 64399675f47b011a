/*
 * C kernels over packed offset ranges: the same functions as proxy/commits/_packed_py.py,
 * with identical results (tests compare them).
 *
 * A packed range is 17 bytes: int64 Start, int64 End (big-endian) and a zero byte (an
 * empty tagged-field section), the element layout of OffsetCommit's OffsetRanges (and of
 * IndividualCommitValue v0's Ranges; v1 holds them as varint deltas, to_deltas here). A
 * range commit's ranges go from the client's frame to the log record without a Python
 * object per range.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RANGE_SIZE 17
#define MAX_OFFSET INT64_MAX

typedef struct {
    int64_t start;
    int64_t end;
} range_t;

static inline int64_t load_be64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return (int64_t)__builtin_bswap64(v);
}

static inline void store_range(unsigned char *p, range_t r) {
    uint64_t a = __builtin_bswap64((uint64_t)r.start);
    uint64_t b = __builtin_bswap64((uint64_t)r.end);
    memcpy(p, &a, 8);
    memcpy(p + 8, &b, 8);
    p[16] = 0;
}

static inline int range_less(range_t a, range_t b) {
    return a.start < b.start || (a.start == b.start && a.end < b.end);
}

static int compare_ranges(const void *x, const void *y) {
    const range_t *a = x, *b = y;
    if (a->start != b->start) return a->start < b->start ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return 0;
}

/* Packed ranges read into a sorted array. The array is malloc'd (the caller frees it;
 * NULL with *count 0 for no ranges); *sorted_in tells whether the input was in order. */
static int read_sorted(Py_buffer *view, range_t **out, Py_ssize_t *count, int *sorted_in) {
    const unsigned char *p = view->buf;
    Py_ssize_t n;
    range_t *ranges;
    int ordered = 1;

    *out = NULL;
    *count = 0;
    if (sorted_in) *sorted_in = 1;
    if (view->len % RANGE_SIZE) {
        PyErr_Format(PyExc_ValueError, "packed ranges of %zd bytes: not a multiple of %d", view->len, RANGE_SIZE);
        return -1;
    }
    n = view->len / RANGE_SIZE;
    if (n == 0) return 0;
    ranges = PyMem_Malloc((size_t)n * sizeof(range_t));
    if (!ranges) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++, p += RANGE_SIZE) {
        ranges[i].start = load_be64(p);
        ranges[i].end = load_be64(p + 8);
        if (i && range_less(ranges[i], ranges[i - 1])) ordered = 0;
    }
    if (!ordered) qsort(ranges, (size_t)n, sizeof(range_t), compare_ranges);
    if (sorted_in) *sorted_in = ordered;
    *out = ranges;
    *count = n;
    return 0;
}

static PyObject *pack_ranges(const range_t *ranges, Py_ssize_t n) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * RANGE_SIZE);
    if (!out) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++, p += RANGE_SIZE) store_range(p, ranges[i]);
    return out;
}

/* Why sorted ranges are not a valid commit, as a new str; Py_None (new reference) when
 * they are valid. The checks and messages are those of _packed_py.invalid. */
static PyObject *invalid(const range_t *r, Py_ssize_t n) {
    int64_t previous = -1;
    if (r[0].start < 0)
        return PyUnicode_FromFormat("negative offset in range [%lld, %lld]", (long long)r[0].start,
                                    (long long)r[0].end);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (r[i].end < 0)
            return PyUnicode_FromFormat("negative offset in range [%lld, %lld]", (long long)r[i].start,
                                        (long long)r[i].end);
        if (r[i].start > r[i].end)
            return PyUnicode_FromFormat("range start %lld is above its end %lld", (long long)r[i].start,
                                        (long long)r[i].end);
        if (r[i].start <= previous)
            return PyUnicode_FromFormat("ranges overlap at offset %lld", (long long)r[i].start);
        previous = r[i].end;
    }
    if (previous >= MAX_OFFSET)
        return PyUnicode_FromFormat("range end %lld is beyond the largest offset", (long long)previous);
    Py_RETURN_NONE;
}

static PyObject *kern_sort_checked(PyObject *self, PyObject *args) {
    PyObject *source, *reason = NULL, *packed = NULL, *result = NULL;
    Py_buffer view;
    range_t *ranges = NULL;
    Py_ssize_t n;
    int sorted_in;

    if (!PyArg_ParseTuple(args, "O", &source)) return NULL;
    if (PyObject_GetBuffer(source, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (read_sorted(&view, &ranges, &n, &sorted_in) < 0) goto done;
    if (n == 0) {
        result = Py_BuildValue("(sy#)", "no ranges", "", (Py_ssize_t)0);
        goto done;
    }
    reason = invalid(ranges, n);
    if (!reason) goto done;
    if (sorted_in && PyBytes_CheckExact(source)) {
        Py_INCREF(source);
        packed = source;  /* already in order: the caller's bytes as they are */
    } else {
        packed = pack_ranges(ranges, n);
        if (!packed) goto done;
    }
    result = PyTuple_Pack(2, reason, packed);
done:
    Py_XDECREF(reason);
    Py_XDECREF(packed);
    PyMem_Free(ranges);
    PyBuffer_Release(&view);
    return result;
}

/* Walks the union of two sorted arrays in (start, end) order. */
typedef struct {
    const range_t *a, *b;
    Py_ssize_t na, nb, i, j;
} union_walk;

static inline int walk_next(union_walk *w, range_t *out) {
    if (w->i < w->na && (w->j >= w->nb || !range_less(w->b[w->j], w->a[w->i]))) {
        *out = w->a[w->i++];
        return 1;
    }
    if (w->j < w->nb) {
        *out = w->b[w->j++];
        return 1;
    }
    return 0;
}

static inline int walk_peek(union_walk *w, range_t *out) {
    Py_ssize_t i = w->i, j = w->j;
    int got = walk_next(w, out);
    w->i = i;
    w->j = j;
    return got;
}

/* S absorbs the prefix of the union that starts at or below it. -1 with an exception if
 * S would pass the largest int64. */
static int absorb(union_walk *w, int64_t *stable) {
    range_t r;
    while (walk_peek(w, &r)) {
        if (r.start > *stable) break;
        if (r.end >= *stable) {
            if (r.end == INT64_MAX) {
                PyErr_SetString(PyExc_OverflowError, "stable offset beyond the largest int64");
                return -1;
            }
            *stable = r.end + 1;
        }
        walk_next(w, &r);
    }
    return 0;
}

static int read_two(PyObject *args, long long *stable, range_t **held, Py_ssize_t *nh, range_t **commit,
                    Py_ssize_t *nc) {
    Py_buffer hv, cv;
    int rc;
    *held = *commit = NULL;
    if (!PyArg_ParseTuple(args, "Ly*y*", stable, &hv, &cv)) return -1;
    rc = read_sorted(&hv, held, nh, NULL);
    if (rc == 0) rc = read_sorted(&cv, commit, nc, NULL);
    PyBuffer_Release(&hv);
    PyBuffer_Release(&cv);
    if (rc < 0) {
        PyMem_Free(*held);
        PyMem_Free(*commit);
        *held = *commit = NULL;
    }
    return rc;
}

static PyObject *kern_merge(PyObject *self, PyObject *args) {
    long long stable_in;
    range_t *held, *commit, *kept = NULL, r, cur;
    Py_ssize_t nh, nc, nk = 0;
    PyObject *packed = NULL, *result = NULL;

    if (read_two(args, &stable_in, &held, &nh, &commit, &nc) < 0) return NULL;
    int64_t stable = stable_in;
    union_walk w = {held, commit, nh, nc, 0, 0};
    if (absorb(&w, &stable) < 0) goto done;
    if (walk_next(&w, &cur)) {
        kept = PyMem_Malloc((size_t)(nh + nc) * sizeof(range_t));
        if (!kept) {
            PyErr_NoMemory();
            goto done;
        }
        while (walk_next(&w, &r)) {
            if (cur.end != INT64_MAX && r.start > cur.end + 1) {
                kept[nk++] = cur;
                cur = r;
            } else if (r.end > cur.end) {
                cur.end = r.end;
            }
        }
        kept[nk++] = cur;
    }
    packed = pack_ranges(kept, nk);
    if (packed) result = Py_BuildValue("(LN)", (long long)stable, packed);
done:
    PyMem_Free(kept);
    PyMem_Free(held);
    PyMem_Free(commit);
    return result;
}

static PyObject *kern_stable_after(PyObject *self, PyObject *args) {
    long long stable_in;
    range_t *held, *commit;
    Py_ssize_t nh, nc;
    PyObject *result = NULL;

    if (read_two(args, &stable_in, &held, &nh, &commit, &nc) < 0) return NULL;
    int64_t stable = stable_in;
    union_walk w = {held, commit, nh, nc, 0, 0};
    if (absorb(&w, &stable) == 0) result = PyLong_FromLongLong(stable);
    PyMem_Free(held);
    PyMem_Free(commit);
    return result;
}

/* R as varints, two per range (Start - cursor, End - Start; the cursor starts at S and
 * moves to End + 1), as _packed_py.to_deltas writes them. */
static PyObject *kern_to_deltas(PyObject *self, PyObject *args) {
    long long stable_in;
    Py_buffer view;
    PyObject *out = NULL;
    if (!PyArg_ParseTuple(args, "Ly*", &stable_in, &view)) return NULL;
    if (view.len % RANGE_SIZE) {
        PyErr_Format(PyExc_ValueError, "packed ranges of %zd bytes: not a multiple of %d", view.len, RANGE_SIZE);
        goto done;
    }
    Py_ssize_t n = view.len / RANGE_SIZE;
    out = PyBytes_FromStringAndSize(NULL, n * 20);
    if (!out) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *p = view.buf;
    int64_t cursor = stable_in;
    for (Py_ssize_t i = 0; i < n; i++, p += RANGE_SIZE) {
        int64_t start = load_be64(p), end = load_be64(p + 8);
        if (start <= cursor || end < start) {
            PyErr_Format(PyExc_ValueError, "range [%lld, %lld] does not follow %lld in a state above S=%lld",
                         (long long)start, (long long)end, (long long)cursor - 1, stable_in);
            Py_CLEAR(out);
            goto done;
        }
        uint64_t values[2] = {(uint64_t)start - (uint64_t)cursor, (uint64_t)end - (uint64_t)start};
        for (int k = 0; k < 2; k++) {
            uint64_t v = values[k];
            while (v >= 0x80) {
                *w++ = (unsigned char)((v & 0x7F) | 0x80);
                v >>= 7;
            }
            *w++ = (unsigned char)v;
        }
        if (end == INT64_MAX) {
            if (i + 1 < n) {
                PyErr_SetString(PyExc_ValueError, "a range follows one ending at the largest offset");
                Py_CLEAR(out);
                goto done;
            }
        } else {
            cursor = end + 1;
        }
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)(w - (unsigned char *)PyBytes_AS_STRING(out))) < 0) out = NULL;
done:
    PyBuffer_Release(&view);
    return out;
}

static int read_uvarint64(const unsigned char *p, Py_ssize_t len, Py_ssize_t *pos, uint64_t *value) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*pos >= len) {
            PyErr_SetString(PyExc_ValueError, "range deltas end inside a varint");
            return -1;
        }
        unsigned char byte = p[(*pos)++];
        if (shift == 63 && (byte & 0x7F) > 1) {
            PyErr_SetString(PyExc_ValueError, "range delta beyond 64 bits");
            return -1;
        }
        v |= (uint64_t)(byte & 0x7F) << shift;
        if (byte < 0x80) {
            *value = v;
            return 0;
        }
    }
    PyErr_SetString(PyExc_ValueError, "range delta varint longer than 10 bytes");
    return -1;
}

static PyObject *kern_from_deltas(PyObject *self, PyObject *args) {
    long long stable_in;
    Py_buffer view;
    PyObject *out = NULL;
    if (!PyArg_ParseTuple(args, "Ly*", &stable_in, &view)) return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t len = view.len, pos = 0, n = 0;
    out = PyBytes_FromStringAndSize(NULL, (len / 2) * RANGE_SIZE);
    if (!out) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    uint64_t cursor = (uint64_t)stable_in;
    while (pos < len) {
        uint64_t gap, length;
        if (read_uvarint64(p, len, &pos, &gap) < 0 || read_uvarint64(p, len, &pos, &length) < 0) {
            Py_CLEAR(out);
            goto done;
        }
        /* start = cursor + gap and end = start + length, both below the largest offset */
        if (stable_in < 0 || gap == 0 || gap >= (uint64_t)MAX_OFFSET - cursor ||
            length >= (uint64_t)MAX_OFFSET - (cursor + gap)) {
            PyErr_Format(PyExc_ValueError, "range deltas (%llu, %llu) after %llu are not a state's",
                         (unsigned long long)gap, (unsigned long long)length, (unsigned long long)cursor);
            Py_CLEAR(out);
            goto done;
        }
        range_t r = {(int64_t)(cursor + gap), (int64_t)(cursor + gap + length)};
        store_range(w, r);
        w += RANGE_SIZE;
        n++;
        cursor = (uint64_t)r.end + 1;
    }
    if (_PyBytes_Resize(&out, n * RANGE_SIZE) < 0) out = NULL;
done:
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"to_deltas", kern_to_deltas, METH_VARARGS, "R of a state as varint deltas from S."},
    {"from_deltas", kern_from_deltas, METH_VARARGS, "The packed ranges of varint deltas from S."},
    {"sort_checked", kern_sort_checked, METH_VARARGS, "Packed ranges sorted, and why they are invalid (or None)."},
    {"merge", kern_merge, METH_VARARGS, "(S', R') of merging a commit into (S, R), all packed."},
    {"stable_after", kern_stable_after, METH_VARARGS, "S' of merging a commit into (S, R), without R'."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_cpacked",
    .m_doc = "C implementation of proxy.commits._packed_py (same results, much faster).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__cpacked(void) { return PyModule_Create(&module); }
