/* The span hot path in C: optional, and exactly equivalent to the pure-Python code in
 * spans.py (which is used when this module is not built, or GOODTRACE_PURE_PYTHON=1).
 *
 * Only the common case runs here: a running recorder and a span name already resolved to its
 * key. Everything else (first use of a name, disabled or not started, bare decorators,
 * unhashable names) calls back into the Python implementation. State is not copied into C:
 * every call reads the recorder module's globals (_mode, _keys, _clock, _append, and the
 * ambient step: the ContextVar _step_var, defaulting to _step), so there is one source of truth
 * and nothing to keep in sync.
 *
 * A span in the buffer is (key, t0, t1, step, thread, attrs, exc_type), as in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>
#include <time.h>

static PyObject *g_globals = NULL;   /* the spans module's __dict__ */
static PyObject *g_slow_span = NULL; /* spans._span_py */
static PyObject *s_mode, *s_keys, *s_clock, *s_append, *s_step, *s_step_var, *s_category, *s_attrs, *s_name, *s_noop;

typedef struct {
    PyObject_HEAD
    PyObject *key;   /* (name, category, blocking, class) */
    PyObject *attrs; /* mapping or NULL */
    PyObject *t0;    /* int from the clock, NULL until entered */
} SpanObject;

static PyTypeObject SpanBaseType;

static int
span_traverse(SpanObject *self, visitproc visit, void *arg)
{
    /* no Py_VISIT(Py_TYPE(self)): subtype_traverse visits a heap subclass's type */
    Py_VISIT(self->key);
    Py_VISIT(self->attrs);
    Py_VISIT(self->t0);
    return 0;
}

static int
span_clear(SpanObject *self)
{
    Py_CLEAR(self->key);
    Py_CLEAR(self->attrs);
    Py_CLEAR(self->t0);
    return 0;
}

static void
span_dealloc(SpanObject *self)
{
    /* a Python subclass's instance comes here from subtype_dealloc, which owns (and
     * drops) the reference to its heap type */
    PyObject_GC_UnTrack(self);
    span_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A global of the recorder module (borrowed), or NULL with an exception set. */
static PyObject *
recorder_global(PyObject *name)
{
    PyObject *value;
    if (g_globals == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "goodtrace.record._speedups is not bound to the recorder");
        return NULL;
    }
    value = PyDict_GetItemWithError(g_globals, name);
    if (value == NULL && !PyErr_Occurred()) {
        PyErr_SetObject(PyExc_NameError, name);
    }
    return value;
}

static PyObject *g_perf_counter_ns = NULL; /* time.perf_counter_ns */

static PyObject *
read_clock(void)
{
    PyObject *clock = recorder_global(s_clock);
    if (clock == NULL) {
        return NULL;
    }
#if defined(__linux__) && defined(CLOCK_MONOTONIC)
    /* time.perf_counter_ns() on Linux is clock_gettime(CLOCK_MONOTONIC): same value, no call */
    if (clock == g_perf_counter_ns) {
        struct timespec ts;
        if (clock_gettime(CLOCK_MONOTONIC, &ts) == 0) {
            return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
        }
    }
#endif
    {
        PyObject *now;
        Py_INCREF(clock); /* its call runs Python code, which may rebind the global */
        now = PyObject_CallNoArgs(clock);
        Py_DECREF(clock);
        return now;
    }
}

/* The calling thread's id as an int; one int object per thread, not one per span. */
static unsigned long g_last_ident = 0;
static PyObject *g_last_ident_obj = NULL;

static PyObject *
thread_ident(void)
{
    unsigned long ident = PyThread_get_thread_ident();
    if (g_last_ident_obj == NULL || ident != g_last_ident) {
        PyObject *obj = PyLong_FromUnsignedLong(ident);
        if (obj == NULL) {
            return NULL;
        }
        Py_XSETREF(g_last_ident_obj, obj);
        g_last_ident = ident;
    }
    Py_INCREF(g_last_ident_obj);
    return g_last_ident_obj;
}

/* The ambient step (a new reference): _step_var's value in this context, else _step, as
 * spans.py's _get_step(_step). Runs no Python code (a ContextVar lookup is C). */
static PyObject *
ambient_step(void)
{
    PyObject *var, *fallback, *value = NULL;
    var = recorder_global(s_step_var);
    if (var == NULL) {
        return NULL;
    }
    fallback = recorder_global(s_step);
    if (fallback == NULL) {
        return NULL;
    }
    if (!PyContextVar_CheckExact(var)) {
        PyErr_SetString(PyExc_TypeError, "goodtrace: _step_var is not a ContextVar");
        return NULL;
    }
    if (PyContextVar_Get(var, fallback, &value) < 0) {
        return NULL;
    }
    return value;
}

static PyObject *
span_enter(SpanObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *t0 = read_clock();
    if (t0 == NULL) {
        return NULL;
    }
    Py_XSETREF(self->t0, t0);
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *
span_exit(SpanObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *t1, *append, *step, *ident, *record, *result, *attrs;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "__exit__ takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (self->t0 == NULL || self->key == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "goodtrace span exited without being entered");
        return NULL;
    }
    t1 = read_clock();
    if (t1 == NULL) {
        return NULL;
    }
    ident = thread_ident();
    if (ident == NULL) {
        Py_DECREF(t1);
        return NULL;
    }
    /* Allocate first: the allocation can run the cyclic GC, whose callbacks run Python code
     * that may switch threads and rebind the globals (finish() or a new step elsewhere). The
     * globals and the span's fields are read only after it, and owned at once. */
    record = PyTuple_New(7);
    if (record == NULL) {
        Py_DECREF(t1);
        Py_DECREF(ident);
        return NULL;
    }
    PyTuple_SET_ITEM(record, 2, t1);
    PyTuple_SET_ITEM(record, 4, ident);
    if (self->t0 == NULL || self->key == NULL) { /* cleared by that Python code */
        Py_DECREF(record);
        PyErr_SetString(PyExc_RuntimeError, "goodtrace span exited without being entered");
        return NULL;
    }
    append = recorder_global(s_append);
    if (append == NULL) {
        Py_DECREF(record);
        return NULL;
    }
    Py_INCREF(append); /* owned: the call below runs Python code, which may rebind the global */
    step = ambient_step();
    if (step == NULL) {
        Py_DECREF(append);
        Py_DECREF(record);
        return NULL;
    }
    PyTuple_SET_ITEM(record, 3, step);
    Py_INCREF(self->key);
    PyTuple_SET_ITEM(record, 0, self->key);
    Py_INCREF(self->t0);
    PyTuple_SET_ITEM(record, 1, self->t0);
    attrs = self->attrs == NULL ? Py_None : self->attrs;
    Py_INCREF(attrs);
    PyTuple_SET_ITEM(record, 5, attrs);
    Py_INCREF(args[0]);
    PyTuple_SET_ITEM(record, 6, args[0]);
    result = PyObject_CallOneArg(append, record);
    Py_DECREF(append);
    Py_DECREF(record);
    if (result == NULL) {
        return NULL;
    }
    Py_DECREF(result);
    Py_RETURN_NONE;
}

static PyMethodDef span_methods[] = {
    {"__enter__", (PyCFunction)span_enter, METH_NOARGS, "Start timing: t0 = the recorder's clock."},
    {"__exit__", (PyCFunction)(void (*)(void))span_exit, METH_FASTCALL,
     "Stop timing and append (key, t0, t1, step, thread, attrs, exc_type) to the buffer."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef span_members[] = {
    {"key", T_OBJECT_EX, offsetof(SpanObject, key), 0, "(name, category, blocking, class)"},
    {"attrs", T_OBJECT, offsetof(SpanObject, attrs), 0, "attributes, or None"},
    {"t0", T_OBJECT_EX, offsetof(SpanObject, t0), 0, "start time (clock ns)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SpanBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "goodtrace.record._speedups.SpanBase",
    .tp_basicsize = sizeof(SpanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "C base of goodtrace's Span: __enter__/__exit__ without a Python frame.",
    .tp_traverse = (traverseproc)span_traverse,
    .tp_clear = (inquiry)span_clear,
    .tp_dealloc = (destructor)span_dealloc,
    .tp_methods = span_methods,
    .tp_members = span_members,
};

static PyObject *
call_slow(PyObject *name, PyObject *category, PyObject *attrs)
{
    PyObject *args[3] = {name, category, attrs};
    if (g_slow_span == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "goodtrace.record._speedups is not bound to the recorder");
        return NULL;
    }
    return PyObject_Vectorcall(g_slow_span, args, 3, NULL);
}

PyDoc_STRVAR(span_doc,
"span(name, category=None, attrs=None)\n--\n\n"
"A timed span (see goodtrace.span): the C fast path of goodtrace.record.spans._span_py.");

static PyObject *
speedups_span(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *name = NULL, *category = Py_None, *attrs = Py_None;
    PyObject *mode, *keys, *lookup, *key, *cls;
    Py_ssize_t i, nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    SpanObject *span;

    if (g_slow_span == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "goodtrace.record._speedups is not bound to the recorder");
        return NULL;
    }
    if (nargs > 3) {
        return PyObject_Vectorcall(g_slow_span, args, nargs, kwnames); /* its TypeError */
    }
    if (nargs > 0) name = args[0];
    if (nargs > 1) category = args[1];
    if (nargs > 2) attrs = args[2];
    for (i = 0; i < nkw; i++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, i);
        PyObject *value = args[nargs + i];
        if (kw == s_category && nargs < 2) category = value;
        else if (kw == s_attrs && nargs < 3) attrs = value;
        else if (kw == s_name && nargs < 1) name = value;
        else return PyObject_Vectorcall(g_slow_span, args, nargs, kwnames); /* its TypeError */
    }
    if (name == NULL) {
        return PyObject_Vectorcall(g_slow_span, args, nargs, kwnames);
    }

    mode = recorder_global(s_mode);
    if (mode == NULL) return NULL;
    if (!PyLong_CheckExact(mode) || PyLong_AsLong(mode) != 0) {
        if (PyLong_CheckExact(mode) && PyLong_AsLong(mode) == 1) { /* _DISABLED: the shared no-op */
            PyObject *noop = PyDict_GetItemWithError(g_globals, s_noop);
            if (noop != NULL) {
                Py_INCREF(noop);
                return noop;
            }
            if (PyErr_Occurred()) return NULL;
        }
        return call_slow(name, category, attrs);
    }
    keys = recorder_global(s_keys);
    if (keys == NULL) return NULL;
    if (!PyDict_CheckExact(keys)) return call_slow(name, category, attrs);
    /* owned: the allocation of the lookup tuple can run the cyclic GC (and its Python
     * callbacks), and the lookup itself a user's __hash__/__eq__; either may rebind it */
    Py_INCREF(keys);
    if (category == Py_None) {
        Py_INCREF(name);
        lookup = name;
    }
    else {
        lookup = PyTuple_Pack(2, name, category);
        if (lookup == NULL) {
            Py_DECREF(keys);
            return NULL;
        }
    }
    key = PyDict_GetItemWithError(keys, lookup);
    Py_XINCREF(key); /* owned from here: nothing below may run Python code while it is borrowed */
    Py_DECREF(lookup);
    Py_DECREF(keys);
    if (key == NULL) {
        PyErr_Clear(); /* KeyError-equivalent or unhashable: Python resolves and reports */
        return call_slow(name, category, attrs);
    }
    if (!PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) != 4) {
        Py_DECREF(key);
        return call_slow(name, category, attrs);
    }
    cls = PyTuple_GET_ITEM(key, 3);
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &SpanBaseType)) {
        Py_DECREF(key);
        return call_slow(name, category, attrs);
    }
    /* the key (and so cls) is owned before allocating: an allocation can run the cyclic GC
     * and its Python callbacks (goodtrace's own gc span among them) */
    span = (SpanObject *)((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
    if (span == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    span->key = key;
    if (attrs != Py_None) {
        Py_INCREF(attrs);
        span->attrs = attrs;
    }
    return (PyObject *)span;
}

static PyObject *
speedups_new_span(PyObject *Py_UNUSED(module), PyObject *cls)
{
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &SpanBaseType)) {
        PyErr_SetString(PyExc_TypeError, "new_span: not a SpanBase subclass");
        return NULL;
    }
    return ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
}

static PyObject *
speedups_bind(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *globals, *slow;
    if (!PyArg_ParseTuple(args, "O!O:bind", &PyDict_Type, &globals, &slow)) {
        return NULL;
    }
    if (!PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_TypeError, "bind: slow_span must be callable");
        return NULL;
    }
    Py_INCREF(globals);
    Py_XSETREF(g_globals, globals);
    Py_INCREF(slow);
    Py_XSETREF(g_slow_span, slow);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------ Sink
 * The record buffer's bounded append (goodtrace.record.encoding.RecordBuffer): Sink(records, limit)
 * is a callable that appends its one argument to the deque `records` while it holds fewer than
 * `limit` items, and otherwise drops it and counts it in `dropped`. The length check and the
 * append run under the GIL with no Python code in between, so the bound holds for every
 * thread. */

typedef struct {
    PyObject_HEAD
    PyObject *records;
    PyObject *push; /* records.append */
    Py_ssize_t limit;
    Py_ssize_t dropped;
    vectorcallfunc vectorcall;
} SinkObject;

static PyObject *
sink_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    SinkObject *self = (SinkObject *)op;
    Py_ssize_t size;
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Sink takes exactly one record");
        return NULL;
    }
    size = PyObject_Length(self->records);
    if (size < 0) {
        return NULL;
    }
    if (size >= self->limit) {
        self->dropped++;
        Py_RETURN_NONE;
    }
    return PyObject_CallOneArg(self->push, args[0]);
}

static PyObject *
sink_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *records;
    Py_ssize_t limit;
    SinkObject *self;
    static char *kwlist[] = {"records", "limit", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "On", kwlist, &records, &limit)) {
        return NULL;
    }
    self = (SinkObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->push = PyObject_GetAttrString(records, "append");
    if (self->push == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    Py_INCREF(records);
    self->records = records;
    self->limit = limit;
    self->dropped = 0;
    self->vectorcall = sink_vectorcall;
    return (PyObject *)self;
}

static int
sink_traverse(SinkObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->records);
    Py_VISIT(self->push);
    return 0;
}

static int
sink_clear(SinkObject *self)
{
    Py_CLEAR(self->records);
    Py_CLEAR(self->push);
    return 0;
}

static void
sink_dealloc(SinkObject *self)
{
    PyObject_GC_UnTrack(self);
    sink_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef sink_members[] = {
    {"dropped", T_PYSSIZET, offsetof(SinkObject, dropped), READONLY, "records refused because the buffer was full"},
    {"limit", T_PYSSIZET, offsetof(SinkObject, limit), READONLY, "the most records the buffer holds"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SinkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "goodtrace.record._speedups.Sink",
    .tp_basicsize = sizeof(SinkObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Sink(records, limit): append to the deque records while it holds fewer than limit items; "
              "count the rest in dropped.",
    .tp_new = sink_new,
    .tp_traverse = (traverseproc)sink_traverse,
    .tp_clear = (inquiry)sink_clear,
    .tp_dealloc = (destructor)sink_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(SinkObject, vectorcall),
    .tp_members = sink_members,
};

/* ------------------------------------------------------------------------------ encode_plain_spans
 * The writer's hot loop (goodtrace.record.encoding._Encoder.encode_many): from records[start:],
 * encode consecutive *plain* spans -- (key, t0, t1, step, thread, None, None) with int times,
 * step and thread, whose key has a prefix in `prefixes` (key -> the UTF-8 bytes of
 * '{"kind":"span","name":...,"cat":...,"t0":') -- into one bytes object, and stop at the first
 * record that is anything else. Returns (bytes, index of that record). The lines are byte for
 * byte what the Python encoder writes. No Python code runs inside the loop (exact tuples and
 * ints; the dict lookup compares keys of str, bool and type), so the borrowed items stay valid. */

/* Decimal digits of v at out (no terminator); returns how many. */
static size_t
put_u64(char *out, unsigned long long v)
{
    char tmp[24];
    size_t n = 0, k;
    do {
        tmp[n++] = (char)('0' + (v % 10));
        v /= 10;
    } while (v != 0);
    for (k = 0; k < n; k++) {
        out[k] = tmp[n - 1 - k];
    }
    return n;
}

static size_t
put_i64(char *out, long long v)
{
    if (v < 0) {
        out[0] = '-';
        return 1 + put_u64(out + 1, (unsigned long long)(-(v + 1)) + 1u);
    }
    return put_u64(out, (unsigned long long)v);
}

static size_t
put_text(char *out, const char *text)
{
    size_t n = strlen(text);
    memcpy(out, text, n);
    return n;
}

static PyObject *
speedups_encode_plain_spans(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *records, *prefixes, *result;
    Py_ssize_t start, n, i;
    char *buf = NULL;
    size_t cap = 0, len = 0;
    if (nargs != 3 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "encode_plain_spans(records: list, prefixes: dict, start: int)");
        return NULL;
    }
    records = args[0];
    prefixes = args[1];
    start = PyLong_AsSsize_t(args[2]);
    if (start < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "start must be >= 0");
        }
        return NULL;
    }
    n = PyList_GET_SIZE(records);
    {
    PyObject *last_key = NULL, *last_prefix = NULL; /* borrowed: records and prefixes hold them */
    for (i = start; i < n; i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        PyObject *key, *prefix, *t0, *t1, *step, *tid;
        long long v0, v1, vstep;
        unsigned long long vtid;
        Py_ssize_t plen;
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 7) {
            break;
        }
        key = PyTuple_GET_ITEM(rec, 0);
        t0 = PyTuple_GET_ITEM(rec, 1);
        t1 = PyTuple_GET_ITEM(rec, 2);
        step = PyTuple_GET_ITEM(rec, 3);
        tid = PyTuple_GET_ITEM(rec, 4);
        if (!PyTuple_CheckExact(key) || PyTuple_GET_ITEM(rec, 5) != Py_None || PyTuple_GET_ITEM(rec, 6) != Py_None
            || !PyLong_CheckExact(t0) || !PyLong_CheckExact(t1) || !PyLong_CheckExact(step)
            || !PyLong_CheckExact(tid)) {
            break;
        }
        if (key == last_key) {
            prefix = last_prefix;
        }
        else {
            prefix = PyDict_GetItemWithError(prefixes, key);
            if (prefix == NULL) {
                if (PyErr_Occurred()) {
                    PyMem_Free(buf);
                    return NULL;
                }
                break;
            }
            if (!PyBytes_Check(prefix)) {
                break;
            }
            last_key = key;
            last_prefix = prefix;
        }
        v0 = PyLong_AsLongLong(t0);
        v1 = PyLong_AsLongLong(t1);
        vstep = PyLong_AsLongLong(step);
        vtid = PyLong_AsUnsignedLongLong(tid);
        if (PyErr_Occurred()) { /* out of range: the Python encoder writes it */
            PyErr_Clear();
            break;
        }
        plen = PyBytes_GET_SIZE(prefix);
        if (len + (size_t)plen + 160 > cap) {
            size_t want = (len + (size_t)plen + 160) * 2;
            char *grown = PyMem_Realloc(buf, want);
            if (grown == NULL) {
                PyMem_Free(buf);
                return PyErr_NoMemory();
            }
            buf = grown;
            cap = want;
        }
        memcpy(buf + len, PyBytes_AS_STRING(prefix), (size_t)plen);
        len += (size_t)plen; /* then at most 4 numbers of 20 digits and 52 bytes of text */
        len += put_i64(buf + len, v0);
        len += put_text(buf + len, ",\"t1\":");
        len += put_i64(buf + len, v1);
        len += put_text(buf + len, ",\"step\":");
        len += put_i64(buf + len, vstep);
        len += put_text(buf + len, ",\"tid\":");
        len += put_u64(buf + len, vtid);
        len += put_text(buf + len, ",\"err\":false,\"attrs\":null}\n");
    }
    }
    result = Py_BuildValue("(y#n)", buf == NULL ? "" : buf, (Py_ssize_t)len, i);
    PyMem_Free(buf);
    return result;
}

static PyMethodDef module_methods[] = {
    {"span", (PyCFunction)(void (*)(void))speedups_span, METH_FASTCALL | METH_KEYWORDS, span_doc},
    {"new_span", speedups_new_span, METH_O, "new_span(cls): an empty span of a SpanBase subclass."},
    {"encode_plain_spans", (PyCFunction)(void (*)(void))speedups_encode_plain_spans, METH_FASTCALL,
     "encode_plain_spans(records, prefixes, start) -> (bytes, stop): the writer's loop over plain spans."},
    {"bind", speedups_bind, METH_VARARGS,
     "bind(recorder_globals, slow_span): read state from these globals; defer to slow_span."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    "goodtrace.record._speedups",
    "Optional C fast path for goodtrace spans (see spans.py for the reference code).",
    -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *m;
    s_mode = PyUnicode_InternFromString("_mode");
    s_keys = PyUnicode_InternFromString("_keys");
    s_clock = PyUnicode_InternFromString("_clock");
    s_append = PyUnicode_InternFromString("_append");
    s_step = PyUnicode_InternFromString("_step");
    s_step_var = PyUnicode_InternFromString("_step_var");
    s_category = PyUnicode_InternFromString("category");
    s_attrs = PyUnicode_InternFromString("attrs");
    s_name = PyUnicode_InternFromString("name");
    s_noop = PyUnicode_InternFromString("NOOP_SPAN");
    if (!s_noop || !s_mode || !s_keys || !s_clock || !s_append || !s_step || !s_step_var || !s_category || !s_attrs || !s_name) {
        return NULL;
    }
    {
        PyObject *time_module = PyImport_ImportModule("time");
        if (time_module == NULL) {
            return NULL;
        }
        g_perf_counter_ns = PyObject_GetAttrString(time_module, "perf_counter_ns");
        Py_DECREF(time_module);
        if (g_perf_counter_ns == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&SpanBaseType) < 0 || PyType_Ready(&SinkType) < 0) {
        return NULL;
    }
    m = PyModule_Create(&speedups_module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&SpanBaseType);
    if (PyModule_AddObject(m, "SpanBase", (PyObject *)&SpanBaseType) < 0) {
        Py_DECREF(&SpanBaseType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&SinkType);
    if (PyModule_AddObject(m, "Sink", (PyObject *)&SinkType) < 0) {
        Py_DECREF(&SinkType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
