/* The native writer's Python side: NativeRing(...) is the recorder's buffer append (a callable
 * taking one record tuple, as RecordBuffer.append) and the handle on the writer thread of
 * native_writer.c.
 *
 * The common records (plain spans, steps, sync points, tags, metrics with a float, int or no
 * value) are stored as plain fields: a few integer conversions and a 64-byte copy, under the
 * GIL like every append. Their names are interned once, as the JSON text the Python encoder
 * makes (string_json, span_prefix). Any other record (attributes, an error, an event, the
 * finish record, a value of another type) is encoded here by the Python encoder (encode_line)
 * and put in the ring as bytes, in order. A record that cannot be encoded is counted as
 * dropped: nothing raises into the training loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <unistd.h>

#include "native_writer.h"

#define KEY_CACHE 256

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    NativeWriter *w;
    PyObject *ids;         /* text object (a name, a span key) -> int id; holds them alive */
    PyObject *string_json; /* str -> bytes: the JSON of a name */
    PyObject *span_prefix; /* key -> bytes: a plain span's line up to "t0": */
    PyObject *encode_line; /* record -> bytes: any record, by the Python encoder */
    PyObject *kinds[5];    /* schema.STEP, SYNC, TAG, METRIC, the span key's type (tuple) */
    Py_ssize_t limit;
    struct { PyObject *key; uint32_t id; } cache[KEY_CACHE];
    int closed;
    int map_errno; /* why the ring is not in a file, when one was asked for */
} RingObject;

static int64_t
text_id(RingObject *self, PyObject *obj, int span_key)
{
    PyObject *found, *json;
    int64_t id;
    if (span_key) {
        size_t slot = ((uintptr_t)obj >> 4) % KEY_CACHE;
        if (self->cache[slot].key == obj) {
            return self->cache[slot].id;
        }
    }
    found = PyDict_GetItemWithError(self->ids, obj);
    if (found != NULL) {
        id = PyLong_AsLongLong(found);
    } else {
        if (PyErr_Occurred()) {
            return -1;
        }
        json = PyObject_CallOneArg(span_key ? self->span_prefix : self->string_json, obj);
        if (json == NULL) {
            return -1;
        }
        if (!PyBytes_Check(json)) {
            Py_DECREF(json);
            PyErr_SetString(PyExc_TypeError, "interned text must be bytes");
            return -1;
        }
        id = nw_add_text(self->w, PyBytes_AS_STRING(json), (size_t)PyBytes_GET_SIZE(json));
        Py_DECREF(json);
        if (id < 0) {
            return -1; /* the table is full: the record goes through the Python encoder */
        }
        PyObject *value = PyLong_FromLongLong(id);
        if (value == NULL || PyDict_SetItem(self->ids, obj, value) < 0) {
            Py_XDECREF(value);
            return -1;
        }
        Py_DECREF(value);
    }
    if (span_key && id >= 0) {
        size_t slot = ((uintptr_t)obj >> 4) % KEY_CACHE;
        self->cache[slot].key = obj; /* borrowed: self->ids keeps it alive */
        self->cache[slot].id = (uint32_t)id;
    }
    return id;
}

/* an int field: 1 and *out set, 0 when None (absent), -1 when another type or out of range */
static int
int_field(PyObject *obj, int64_t *out)
{
    if (obj == Py_None) {
        return 0;
    }
    if (!PyLong_CheckExact(obj)) {
        return -1;
    }
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    return 1;
}

static int
put_blob(RingObject *self, const char *data, Py_ssize_t len)
{
    uint32_t size = (uint32_t)((sizeof(BlobHeader) + (size_t)len + 7) & ~(size_t)7);
    BlobHeader *b;
    if ((uint64_t)size > self->w->capacity / 4 || (b = (BlobHeader *)nw_reserve(self->w, size)) == NULL) {
        return -1;
    }
    b->size = size;
    b->type = E_BLOB;
    b->flags = 0;
    b->len = (uint32_t)len;
    memcpy(b + 1, data, (size_t)len);
    nw_commit(self->w, size);
    return 0;
}

/* Fill e from a common record; 0 when it is one, -1 when it must go through Python. */
static int
fields(RingObject *self, PyObject *record, Entry *e)
{
    Py_ssize_t n = PyTuple_GET_SIZE(record);
    PyObject *kind;
    int64_t id, step = 0;
    int has;
    if (n < 1) {
        return -1;
    }
    kind = PyTuple_GET_ITEM(record, 0);
    memset(e, 0, sizeof(*e));
    e->size = sizeof(Entry);
    if (PyTuple_CheckExact(kind)) { /* a span: (key, t0, t1, step, thread, attrs, exc_type) */
        if (n != 7 || PyTuple_GET_ITEM(record, 5) != Py_None || PyTuple_GET_ITEM(record, 6) != Py_None) {
            return -1;
        }
        PyObject *tid = PyTuple_GET_ITEM(record, 4);
        if (int_field(PyTuple_GET_ITEM(record, 1), &e->v[0]) != 1 || int_field(PyTuple_GET_ITEM(record, 2), &e->v[1]) != 1 ||
            (has = int_field(PyTuple_GET_ITEM(record, 3), &e->v[2])) < 0 || !PyLong_CheckExact(tid)) {
            return -1;
        }
        unsigned long long t = PyLong_AsUnsignedLongLong(tid);
        if (t == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        e->v[3] = (int64_t)t;
        if ((id = text_id(self, kind, 1)) < 0) {
            PyErr_Clear();
            return -1;
        }
        e->type = E_SPAN;
        e->id1 = (uint32_t)id;
        e->flags = has ? F_STEP : 0;
        return 0;
    }
    if ((has = n > 1 ? int_field(PyTuple_GET_ITEM(record, 1), &step) : -1) < 0 && kind != self->kinds[3]) {
        return -1;
    }
    if (kind == self->kinds[0] && (n == 4 || n == 5)) { /* (STEP, step, t0, t1[, seq]) */
        e->type = E_STEP;
        e->v[0] = step;
        e->flags = has ? F_STEP : 0;
        if (int_field(PyTuple_GET_ITEM(record, 2), &e->v[1]) != 1 || int_field(PyTuple_GET_ITEM(record, 3), &e->v[2]) != 1) {
            return -1;
        }
        if (n == 5 && (has = int_field(PyTuple_GET_ITEM(record, 4), &e->v[3])) < 0) {
            return -1;
        }
        e->flags |= n == 5 && has ? F_SEQ : 0;
        return 0;
    }
    if (kind == self->kinds[1] && n >= 4 && n <= 6) { /* (SYNC, step, t, how[, seq[, after]]) */
        e->type = E_SYNC;
        e->v[0] = step;
        e->flags = has ? F_STEP : 0;
        if (int_field(PyTuple_GET_ITEM(record, 2), &e->v[1]) != 1 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(record, 3))) {
            return -1;
        }
        if (n >= 5 && (has = int_field(PyTuple_GET_ITEM(record, 4), &e->v[2])) != 0) {
            if (has < 0) {
                return -1;
            }
            e->flags |= F_SEQ;
        }
        if (n == 6 && (has = int_field(PyTuple_GET_ITEM(record, 5), &e->v[3])) != 0) {
            if (has < 0) {
                return -1;
            }
            e->flags |= F_AFTER;
        }
        if ((id = text_id(self, PyTuple_GET_ITEM(record, 3), 0)) < 0) {
            PyErr_Clear();
            return -1;
        }
        e->id1 = (uint32_t)id;
        return 0;
    }
    if (kind == self->kinds[2] && n == 4) { /* (TAG, step, name, t) */
        e->type = E_TAG;
        e->v[0] = step;
        e->flags = has ? F_STEP : 0;
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(record, 2)) || int_field(PyTuple_GET_ITEM(record, 3), &e->v[1]) != 1) {
            return -1;
        }
        if ((id = text_id(self, PyTuple_GET_ITEM(record, 2), 0)) < 0) {
            PyErr_Clear();
            return -1;
        }
        e->id1 = (uint32_t)id;
        return 0;
    }
    if (kind == self->kinds[3] && n == 6) { /* (METRIC, name, step, value, reduce, t) */
        PyObject *name = PyTuple_GET_ITEM(record, 1), *value = PyTuple_GET_ITEM(record, 3);
        PyObject *reduce = PyTuple_GET_ITEM(record, 4);
        int64_t rid;
        e->type = E_METRIC;
        if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(reduce) ||
            (has = int_field(PyTuple_GET_ITEM(record, 2), &e->v[0])) < 0 ||
            int_field(PyTuple_GET_ITEM(record, 5), &e->v[1]) != 1) {
            return -1;
        }
        e->flags = has ? F_STEP : 0;
        if (PyFloat_CheckExact(value)) {
            e->d = PyFloat_AS_DOUBLE(value);
            e->flags |= F_VFLOAT;
        } else if (value != Py_None) {
            if (int_field(value, &e->v[2]) != 1) {
                return -1;
            }
            e->flags |= F_VINT;
        }
        if ((id = text_id(self, name, 0)) < 0 || (rid = text_id(self, reduce, 0)) < 0) {
            PyErr_Clear();
            return -1;
        }
        e->id1 = (uint32_t)id;
        e->id2 = (uint32_t)rid;
        return 0;
    }
    return -1;
}

static int
append(RingObject *self, PyObject *record, int always)
{
    Entry e;
    if (self->closed) {
        return 0;
    }
    if (!always && nw_pending(self->w) >= (uint64_t)self->limit) {
        atomic_fetch_add(&self->w->dropped_full, 1);
        return 0;
    }
    if (PyTuple_CheckExact(record) && fields(self, record, &e) == 0) {
        Entry *slot = (Entry *)nw_reserve(self->w, sizeof(Entry));
        if (slot == NULL) {
            atomic_fetch_add(&self->w->dropped_full, 1);
            return 0;
        }
        memcpy(slot, &e, sizeof(Entry));
        nw_commit(self->w, sizeof(Entry));
        return 0;
    }
    /* rare: the Python encoder makes the line, the ring carries it as bytes, in order */
    PyObject *line = PyObject_CallOneArg(self->encode_line, record);
    if (line == NULL || !PyBytes_Check(line)) {
        PyErr_Clear();
        Py_XDECREF(line);
        atomic_fetch_add(&self->w->dropped_encode, 1);
        return 0;
    }
    if (put_blob(self, PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line)) != 0) {
        if (always && atomic_load(&self->w->final_line) == NULL) { /* the finish record: past the bound */
            char *copy = malloc((size_t)PyBytes_GET_SIZE(line));
            if (copy != NULL) {
                memcpy(copy, PyBytes_AS_STRING(line), (size_t)PyBytes_GET_SIZE(line));
                atomic_store(&self->w->final_len, (uint32_t)PyBytes_GET_SIZE(line));
                atomic_store(&self->w->final_line, copy);
                Py_DECREF(line);
                return 0;
            }
        }
        atomic_fetch_add(&self->w->dropped_full, 1);
    }
    Py_DECREF(line);
    return 0;
}

static PyObject *
ring_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "NativeRing takes exactly one record");
        return NULL;
    }
    append((RingObject *)op, args[0], 0);
    Py_RETURN_NONE;
}

static PyObject *
ring_append_always(RingObject *self, PyObject *record)
{
    append(self, record, 1);
    Py_RETURN_NONE;
}

static PyObject *
ring_start(RingObject *self, PyObject *args)
{
    double header_timeout;
    int ok;
    if (!PyArg_ParseTuple(args, "d", &header_timeout)) {
        return NULL;
    }
    if (self->w->started) {
        PyErr_SetString(PyExc_RuntimeError, "the native writer was already started");
        return NULL;
    }
    if (nw_start(self->w) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ok = nw_wait_header(self->w, header_timeout);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ok);
}

static PyObject *
ring_flush(RingObject *self, PyObject *args)
{
    double timeout;
    int ok;
    if (!PyArg_ParseTuple(args, "d", &timeout)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ok = nw_flush(self->w, timeout);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ok);
}

static PyObject *
ring_close(RingObject *self, PyObject *args)
{
    double timeout;
    int ok;
    if (!PyArg_ParseTuple(args, "d", &timeout)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ok = nw_close(self->w, timeout);
    Py_END_ALLOW_THREADS
    self->closed = 1;
    if (ok && self->w->map_path != NULL) { /* a clean finish: everything is in the segments */
        unlink(self->w->map_path);
        free(self->w->map_path);
        self->w->map_path = NULL;
    }
    return PyBool_FromLong(ok);
}

static PyObject *
ring_clear(RingObject *self, PyObject *Py_UNUSED(ignored))
{
    atomic_store(&self->w->shared->discard_until, atomic_load(&self->w->shared->head));
    Py_RETURN_NONE;
}

static PyObject *
ring_stats(RingObject *self, PyObject *Py_UNUSED(ignored))
{
    NativeWriter *w = self->w;
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsisKsLsK}", "dropped_full", (unsigned long long)atomic_load(&w->dropped_full),
        "dropped_write", (unsigned long long)atomic_load(&w->dropped_write), "dropped_encode",
        (unsigned long long)atomic_load(&w->dropped_encode), "lost", (unsigned long long)atomic_load(&w->lost),
        "written", (unsigned long long)atomic_load(&w->written), "write_errors",
        (unsigned long long)atomic_load(&w->write_errors), "recreated", (unsigned long long)atomic_load(&w->recreated),
        "pending", (unsigned long long)nw_pending(w), "last_errno", atomic_load(&w->last_errno), "writes",
        (unsigned long long)atomic_load(&w->writes), "segment", (long long)w->segment, "max_chunk_ns", (unsigned long long)atomic_load(&w->max_chunk_ns));
}

static Py_ssize_t
ring_length(RingObject *self)
{
    return (Py_ssize_t)nw_pending(self->w);
}

static PyObject *
ring_get_dropped(RingObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(atomic_load(&self->w->dropped_full));
}

static PyObject *
ring_get_file(RingObject *self, void *Py_UNUSED(closure))
{
    if (self->w->map == NULL) {
        Py_RETURN_NONE;
    }
    if (self->w->map_path == NULL) { /* removed at a clean close */
        Py_RETURN_NONE;
    }
    return PyBytes_FromString(self->w->map_path);
}

static PyObject *
ring_get_file_errno(RingObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(self->map_errno);
}

static char *
copy_bytes(PyObject *obj, size_t *len)
{
    char *copy;
    if (!PyBytes_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "expected bytes");
        return NULL;
    }
    *len = (size_t)PyBytes_GET_SIZE(obj);
    copy = malloc(*len + 1);
    if (copy == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(copy, PyBytes_AS_STRING(obj), *len);
    copy[*len] = '\0';
    return copy;
}

static PyObject *
ring_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"root", "prefix", "header", "limit", "ring_bytes", "flush_interval_s", "segment_bytes",
                             "string_json", "span_prefix", "encode_line", "kinds", "ring_path", "text_bytes", NULL};
    PyObject *root, *prefix, *header, *string_json, *span_prefix, *encode_line, *kinds, *ring_path = Py_None;
    Py_ssize_t limit;
    unsigned long long ring_bytes, segment_bytes, text_bytes = 4u << 20;
    double interval;
    RingObject *self;
    size_t ignored, header_len[4];
    char *header_parts[4] = {NULL, NULL, NULL, NULL};
    int i, mapped;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!nKdKOOOO!|OK", kwlist, &PyBytes_Type, &root, &PyBytes_Type,
                                     &prefix, &PyTuple_Type, &header, &limit, &ring_bytes, &interval, &segment_bytes,
                                     &string_json, &span_prefix, &encode_line, &PyTuple_Type, &kinds, &ring_path,
                                     &text_bytes)) {
        return NULL;
    }
    if (ring_path != Py_None && !PyBytes_Check(ring_path)) {
        PyErr_SetString(PyExc_TypeError, "NativeRing: ring_path must be bytes or None");
        return NULL;
    }
    if (PyTuple_GET_SIZE(header) != 4 || PyTuple_GET_SIZE(kinds) != 4 || ring_bytes < 4096 || interval <= 0) {
        PyErr_SetString(PyExc_ValueError, "NativeRing: bad arguments");
        return NULL;
    }
    self = (RingObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    for (i = 0; i < 4; i++) {
        header_parts[i] = copy_bytes(PyTuple_GET_ITEM(header, i), &header_len[i]);
        if (header_parts[i] == NULL) {
            for (i = 0; i < 4; i++) {
                free(header_parts[i]);
            }
            Py_DECREF(self);
            return NULL;
        }
    }
    self->w = calloc(1, sizeof(NativeWriter));
    mapped = self->w == NULL ? -1
                             : nw_init(self->w, (ring_bytes + 7) & ~7ULL,
                                       ring_path == Py_None ? NULL : PyBytes_AS_STRING(ring_path), text_bytes,
                                       header_parts, header_len);
    if (mapped < 0) {
        for (i = 0; i < 4; i++) {
            free(header_parts[i]);
        }
        free(self->w);
        self->w = NULL;
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->map_errno = mapped == 1 ? errno : 0;
    for (i = 0; i < 4; i++) {
        self->w->header[i] = header_parts[i];
        self->w->header_len[i] = header_len[i];
    }
    self->w->root = copy_bytes(root, &ignored);
    self->w->prefix = copy_bytes(prefix, &ignored);
    if (self->w->root == NULL || self->w->prefix == NULL || (self->ids = PyDict_New()) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->w->interval_s = interval;
    self->w->shared->interval_ns = (int64_t)(interval * 1e9);
    atomic_store(&self->w->shared->beat_wall, self->w->shared->wall);
    self->w->segment_limit = segment_bytes;
    self->limit = limit;
    Py_INCREF(string_json);
    self->string_json = string_json;
    Py_INCREF(span_prefix);
    self->span_prefix = span_prefix;
    Py_INCREF(encode_line);
    self->encode_line = encode_line;
    for (i = 0; i < 4; i++) {
        self->kinds[i] = PyTuple_GET_ITEM(kinds, i);
        Py_INCREF(self->kinds[i]);
    }
    self->vectorcall = ring_vectorcall;
    return (PyObject *)self;
}

static int
ring_traverse(RingObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ids);
    Py_VISIT(self->string_json);
    Py_VISIT(self->span_prefix);
    Py_VISIT(self->encode_line);
    return 0;
}

static int
ring_clear_refs(RingObject *self)
{
    Py_CLEAR(self->ids);
    Py_CLEAR(self->string_json);
    Py_CLEAR(self->span_prefix);
    Py_CLEAR(self->encode_line);
    memset(self->cache, 0, sizeof(self->cache));
    return 0;
}

static void
ring_dealloc(RingObject *self)
{
    int i;
    PyObject_GC_UnTrack(self);
    ring_clear_refs(self);
    for (i = 0; i < 4; i++) {
        Py_CLEAR(self->kinds[i]);
    }
    /* A writer thread still running (stuck in a hung filesystem) keeps its memory: never freed
     * under it. A stopped or never started one is freed. */
    if (self->w != NULL && (!self->w->started || self->w->exited)) {
        uint32_t id, texts = atomic_load(&self->w->texts);
        for (id = 0; id < texts && self->w->text_area == NULL; id++) {
            free(self->w->pages[id / TEXT_PAGE][id % TEXT_PAGE].data);
        }
        for (i = 0; i < TEXT_PAGES; i++) {
            free(self->w->pages[i]);
        }
        for (i = 0; i < 4; i++) {
            free(self->w->header[i]);
        }
        free(atomic_load(&self->w->final_line));
        nw_release(self->w, 0);
        free(self->w->out);
        free(self->w->root);
        free(self->w->prefix);
        free(self->w);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef ring_methods[] = {
    {"append_always", (PyCFunction)ring_append_always, METH_O, "append past the bound (the finish record)"},
    {"start", (PyCFunction)ring_start, METH_VARARGS, "start(header_timeout_s) -> header written in time"},
    {"flush", (PyCFunction)ring_flush, METH_VARARGS, "flush(timeout_s) -> everything before it written"},
    {"close", (PyCFunction)ring_close, METH_VARARGS, "close(timeout_s) -> flushed, closed, thread ended"},
    {"clear", (PyCFunction)ring_clear, METH_NOARGS, "discard what is waiting (benchmarks)"},
    {"stats", (PyCFunction)ring_stats, METH_NOARGS, "the writer's counters"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ring_getset[] = {
    {"dropped", (getter)ring_get_dropped, NULL, "records refused because the ring was full", NULL},
    {"file", (getter)ring_get_file, NULL, "the ring's file (bytes), or None when the ring is in memory", NULL},
    {"file_errno", (getter)ring_get_file_errno, NULL, "why a ring file asked for could not be made (0: it was)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods ring_as_sequence = {
    .sq_length = (lenfunc)ring_length,
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "goodtrace.record.io._native.NativeRing",
    .tp_basicsize = sizeof(RingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "The native writer: a callable appending one record, and its writer thread.",
    .tp_new = ring_new,
    .tp_traverse = (traverseproc)ring_traverse,
    .tp_clear = (inquiry)ring_clear_refs,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(RingObject, vectorcall),
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
    .tp_as_sequence = &ring_as_sequence,
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    "goodtrace.record.io._native",
    "Optional native writer: a ring of plain records and a writer thread that never takes the GIL.",
    -1,
    NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *m;
    if (PyType_Ready(&RingType) < 0) {
        return NULL;
    }
    m = PyModule_Create(&native_module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "NativeRing", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
