/* dlio_ckpt.storage._trace_c: the traced POSIX handle's hot paths (storage/traced.py) in C.

Why C: a 1 MiB read's copy evicts the interpreter's code and data from the core's L2 cache, so
every Python-level call the tracer adds around it runs cold (~1.5 us an event against 0.3 us at
4 KiB, benchmarks/README.md). Here a read, its two clock readings and the packing and appending
of its event are one call, as are a close and an open (`opener` makes a view's open, a builtin
bound to the view, which calls the backend's opener and registers the path in the recorder's
table without a lock: `path_index`). What little else the tracer does per file is kept to few
cache lines for the same reason: no functools.partial around the open, no copy of its arguments,
and a bytearray that grows by 7/8 rather than 1/8 (append_event).

What each function appends is exactly what events.pack_event packs ("=BBIqqdd": 38 bytes,
native order, no padding), with the phase's RAW_TIMES bit set by the caller: its times are raw
clock readings on time.perf_counter's clock (CLOCK_MONOTONIC; storage/traced.py uses this
module only where perf_counter reports that clock), so they mix with Python-recorded events.

Appends happen with the GIL held, in one step (a resize, or two, and a copy), so threads
appending to one bytearray never interleave or lose an event (bytearray.extend gives the same
guarantee); the system call runs without the GIL, as os.preadv and os.close run it. The module
has no state: what an open needs is in the tuple its builtin is bound to. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if !defined(__linux__)
#error "_trace_c is Linux only (perf_counter's clock elsewhere is not CLOCK_MONOTONIC); the pure-Python tracer is used"
#endif

#define EVENT_BYTES 38

/* time.perf_counter() as CPython computes it on Linux: CLOCK_MONOTONIC as integer nanoseconds,
   converted to a double and divided by 1e9 (_PyTime_AsSecondsDouble; its integer branch for
   whole seconds gives the same double, as such a count is exact in a double). No GIL needed. */
static double
clock_reading(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* cannot fail for this clock; CPython checks it at startup */
    int64_t ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    volatile double seconds = (double)ns;  /* volatile: round to double here, as CPython does */
    return seconds / 1e9;
}

/* What an event is recorded with: the handle's trace tuple, as TracedStorage builds it (phase,
   file index, extend, recorder, events: the recorder's bytearray, borrowed), and the op. */
typedef struct {
    PyObject *events;
    uint8_t op, phase;
    uint32_t file;
} event_head;

static int
parse_byte(PyObject *arg, const char *name, uint8_t *out)
{
    long value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value < 0 || value > 255) {
        PyErr_Format(PyExc_ValueError, "%s must be in 0..255, not %ld", name, value);
        return -1;
    }
    *out = (uint8_t)value;
    return 0;
}

/* What describes an event but its file: checked before any I/O, so that a bad call moves no data. */
static int
parse_event(PyObject *events, PyObject *op, PyObject *phase, event_head *head)
{
    if (!PyByteArray_Check(events)) {
        PyErr_Format(PyExc_TypeError, "events must be a bytearray, not %.100s", Py_TYPE(events)->tp_name);
        return -1;
    }
    head->events = events;
    return parse_byte(op, "op", &head->op) < 0 || parse_byte(phase, "phase", &head->phase) < 0 ? -1 : 0;
}

static int
parse_file(PyObject *file, event_head *head)
{
    unsigned long value = PyLong_AsUnsignedLong(file);
    if (value == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if (value > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "file index must fit in 32 bits");
        return -1;
    }
    head->file = (uint32_t)value;
    return 0;
}

/* A handle's trace tuple (phase, file, extend, recorder, events) and an op. */
static int
parse_head(PyObject *trace, PyObject *op, event_head *head)
{
    if (!PyTuple_CheckExact(trace) || PyTuple_GET_SIZE(trace) != 5) {
        PyErr_SetString(PyExc_TypeError, "trace must be the tuple (phase, file, extend, recorder, events)");
        return -1;
    }
    if (parse_event(PyTuple_GET_ITEM(trace, 4), op, PyTuple_GET_ITEM(trace, 0), head) < 0)
        return -1;
    return parse_file(PyTuple_GET_ITEM(trace, 1), head);
}

/* Pack one event and append it to the bytearray: GIL held, nothing in between can append. */
static int
append_event(const event_head *head, int64_t offset, int64_t length, double start, double end)
{
    char event[EVENT_BYTES];
    event[0] = (char)head->op;
    event[1] = (char)head->phase;
    memcpy(event + 2, &head->file, 4);
    memcpy(event + 6, &offset, 8);
    memcpy(event + 14, &length, 8);
    memcpy(event + 22, &start, 8);
    memcpy(event + 30, &end, 8);
    PyByteArrayObject *array = (PyByteArrayObject *)head->events;
    Py_ssize_t size = Py_SIZE(array);
    /* Room for the event: bytearray grows by 1/8 when full, which copies what it holds ~8 times
       over as it grows to COMPACT_EVENTS events (~300 bytes copied an event). Past 1 KiB it is
       grown here by 7/8 instead (about one copy): a Resize to the larger size allocates exactly
       that, and the Resize down to the event's end then only sets the size, as bytearray keeps
       its allocation unless the size falls under half of it. Its fields (ob_alloc, ob_start,
       ob_bytes) are read only to know whether the event fits. Both Resizes refuse (BufferError)
       while a view of it exists, as extend does; no Python code runs between them. */
    Py_ssize_t room = array->ob_alloc - (array->ob_start - array->ob_bytes) - 1;
    if (size + EVENT_BYTES > room && size >= 1024 && PyByteArray_Resize(head->events, size + (size >> 3) * 7) < 0)
        return -1;
    if (PyByteArray_Resize(head->events, size + EVENT_BYTES) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(head->events) + size, event, EVENT_BYTES);
    return 0;
}

static int
parse_fd(PyObject *arg, int *fd)
{
    long value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value < INT_MIN || value > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "file descriptor out of range");
        return -1;
    }
    *fd = (int)value;
    return 0;
}

static int
check_count(const char *name, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs == expected)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, expected, nargs);
    return -1;
}

PyDoc_STRVAR(read_into_doc,
"read_into(trace, op, fd, buffer, offset) -> bytes read\n\n"
"os.preadv(fd, [buffer], offset), timed, and its event (op, the trace's phase and file, offset,\n"
"bytes read, start, end) appended to the trace's events. Errors as os.preadv's; no event then.");

static PyObject *
read_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    event_head head;
    int fd;
    if (check_count("read_into", nargs, 5) < 0 || parse_head(args[0], args[1], &head) < 0 || parse_fd(args[2], &fd) < 0)
        return NULL;
    long long offset = PyLong_AsLongLong(args[4]);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    /* what os.preadv asks of its buffers: writable (so bytes are refused) and contiguous */
    if (PyObject_GetBuffer(args[3], &view, PyBUF_WRITABLE) < 0)
        return NULL;
    ssize_t count;
    int saved_errno, interrupted = 0;
    double start = clock_reading(), end;
    do {  /* as os.preadv: retry on EINTR unless a signal handler raised (PEP 475) */
        Py_BEGIN_ALLOW_THREADS
        count = pread(fd, view.buf, (size_t)view.len, (off_t)offset);
        end = clock_reading();  /* before taking the GIL back: the event is the system call's */
        saved_errno = errno;
        Py_END_ALLOW_THREADS
    } while (count < 0 && saved_errno == EINTR && !(interrupted = PyErr_CheckSignals()));
    PyBuffer_Release(&view);
    if (interrupted)
        return NULL;
    if (count < 0) {
        errno = saved_errno;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (append_event(&head, offset, count, start, end) < 0)
        return NULL;
    return PyLong_FromSsize_t(count);
}

PyDoc_STRVAR(close_fd_doc,
"close_fd(trace, op, fd) -> number of the trace's events\n\n"
"os.close(fd), timed, and its event (op, the trace's phase and file, -1, 0, start, end) appended\n"
"to the trace's events; returns how many events they hold after, for the caller's compaction\n"
"check. Errors as os.close's (the descriptor is gone all the same, no retry on EINTR); no event\n"
"then.");

static PyObject *
close_fd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    event_head head;
    int fd, result, saved_errno;
    if (check_count("close_fd", nargs, 3) < 0 || parse_head(args[0], args[1], &head) < 0 || parse_fd(args[2], &fd) < 0)
        return NULL;
    double start = clock_reading(), end;
    Py_BEGIN_ALLOW_THREADS
    result = close(fd);
    end = clock_reading();
    saved_errno = errno;
    Py_END_ALLOW_THREADS
    if (result < 0) {
        errno = saved_errno;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (append_event(&head, -1, 0, start, end) < 0)
        return NULL;
    return PyLong_FromSsize_t(PyByteArray_GET_SIZE(head.events) / EVENT_BYTES);
}

/* table[path] (a new reference), adding path first where it is new: index paths[0] +
   len(paths) - 1 (paths is the recorder's window: the index of its first path, then the paths
   added since it last spilled them), path appended to paths. EventRecorder.path_id's lookup and insertion, which Python makes under a
   lock, in one step: nothing below lets another thread run when the paths are str (hashing and
   comparing one runs no Python code, and nothing here allocates an object the garbage collector
   tracks), so the length read, the append and the insertion cannot interleave with another
   thread's. A path of another type may run Python code while it is hashed, but only in the
   lookup (before the length is read) or the insertion (after the append): two threads can then
   add one path twice, each with its own index, never two paths with one index. */
static PyObject *
index_of(PyObject *table, PyObject *paths, PyObject *path)
{
    if (!PyDict_CheckExact(table) || !PyList_CheckExact(paths) || PyList_GET_SIZE(paths) < 1
            || !PyLong_CheckExact(PyList_GET_ITEM(paths, 0))) {
        PyErr_SetString(PyExc_TypeError, "the path table must be a dict and the paths a list [first index, paths...]");
        return NULL;
    }
    PyObject *index = PyDict_GetItemWithError(table, path);  /* borrowed */
    if (index != NULL) {
        Py_INCREF(index);
        return index;
    }
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t base = PyLong_AsSsize_t(PyList_GET_ITEM(paths, 0));
    if (base < 0 && PyErr_Occurred())
        return NULL;
    index = PyLong_FromSsize_t(base + PyList_GET_SIZE(paths) - 1);
    if (index == NULL)
        return NULL;
    if (PyList_Append(paths, path) < 0) {
        Py_DECREF(index);
        return NULL;
    }
    if (PyDict_SetItem(table, path, index) < 0) {
        /* out of memory: the path stays in the list without an entry in the table, so a later
           call adds it again at a new index; no index ever names two paths */
        Py_DECREF(index);
        return NULL;
    }
    return index;
}

PyDoc_STRVAR(path_index_doc,
"path_index(table, paths, path) -> index\n\n"
"table[path], adding path first where it is new (index paths[0] + len(paths) - 1, path appended\n"
"to paths):\n"
"EventRecorder.path_id's lookup and insertion in one step, atomic under the GIL without a lock.");

static PyObject *
path_index(PyObject *module, PyObject *args)
{
    PyObject *table, *paths, *path;  /* borrowed; a new path only (an open in C uses index_of) */
    return PyArg_ParseTuple(args, "OOO:path_index", &table, &paths, &path) ? index_of(table, paths, path) : NULL;
}

PyDoc_STRVAR(open_traced_doc,
"open_traced(path) -> handle\n\n"
"TracedStorage's open of a handle that records its own events, bound to its view (see opener).");

/* An open, bound to its view (opener below): calls opener(path, handle_class) timed, then finds
   or adds the path's index (index_of), sets the handle's _trace to (phase, index, extend,
   recorder, events) and appends the open event (op, phase, index, -1, 0, start, end). A failed
   open adds no path and records nothing. */
static PyObject *
open_traced(PyObject *view, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_count("open_traced", nargs, 1) < 0)
        return NULL;
    PyObject *path = args[0];
    PyObject *phase = PyTuple_GET_ITEM(view, 4), *events = PyTuple_GET_ITEM(view, 7);
    event_head head;
    if (parse_event(events, PyTuple_GET_ITEM(view, 8), phase, &head) < 0)
        return NULL;
    /* a slot before the arguments, which a bound method may use for its self (no copy of them) */
    PyObject *call_args[3] = {NULL, path, PyTuple_GET_ITEM(view, 1)};
    double start = clock_reading();
    PyObject *handle = PyObject_Vectorcall(PyTuple_GET_ITEM(view, 0), call_args + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                           NULL);
    double end = clock_reading();
    if (handle == NULL)
        return NULL;
    /* From here a failure drops the handle, which closes its descriptors as it is collected. */
    PyObject *trace = NULL, *index = index_of(PyTuple_GET_ITEM(view, 2), PyTuple_GET_ITEM(view, 3), path);
    if (index == NULL || parse_file(index, &head) < 0)
        goto fail;
    trace = PyTuple_Pack(5, phase, index, PyTuple_GET_ITEM(view, 5), PyTuple_GET_ITEM(view, 6), events);
    if (trace == NULL || PyObject_SetAttr(handle, PyTuple_GET_ITEM(view, 9), trace) < 0)
        goto fail;
    if (append_event(&head, -1, 0, start, end) < 0)
        goto fail;
    Py_DECREF(trace);
    Py_DECREF(index);
    return handle;
fail:
    Py_XDECREF(trace);
    Py_XDECREF(index);
    Py_DECREF(handle);
    return NULL;
}

static PyMethodDef open_traced_def = {
    "open_traced", (PyCFunction)(void (*)(void))open_traced, METH_FASTCALL, open_traced_doc};

PyDoc_STRVAR(opener_doc,
"opener(view) -> open_traced(path)\n\n"
"TracedStorage's open in C for one view: view is the tuple (opener, handle_class, table, paths,\n"
"phase, extend, recorder, events, op, name): the backend's opener, the handle class it builds, the\n"
"recorder's path table and paths, the view's phase (with RAW_TIMES), the recorder's extend, the\n"
"recorder, its bytearray, the open op and the attribute name '_trace'. Returns a builtin bound to\n"
"the view, so an open is one call into C with no Python frame or functools.partial around it.");

static PyObject *
opener(PyObject *module, PyObject *view)
{
    if (!PyTuple_CheckExact(view) || PyTuple_GET_SIZE(view) != 10 || !PyUnicode_Check(PyTuple_GET_ITEM(view, 9))) {
        PyErr_SetString(PyExc_TypeError, "view must be the tuple (opener, handle_class, table, paths, phase, extend, "
                                         "recorder, events, op, name)");
        return NULL;
    }
    event_head head;  /* refuse a bad phase, op or bytearray now, not at the first open */
    if (parse_event(PyTuple_GET_ITEM(view, 7), PyTuple_GET_ITEM(view, 8), PyTuple_GET_ITEM(view, 4), &head) < 0)
        return NULL;
    return PyCFunction_New(&open_traced_def, view);
}

static PyMethodDef methods[] = {
    {"read_into", (PyCFunction)(void (*)(void))read_into, METH_FASTCALL, read_into_doc},
    {"close_fd", (PyCFunction)(void (*)(void))close_fd, METH_FASTCALL, close_fd_doc},
    {"path_index", path_index, METH_VARARGS, path_index_doc},
    {"opener", opener, METH_O, opener_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dlio_ckpt.storage._trace_c",
    .m_doc = "The traced POSIX handle's hot paths in C (see storage/traced.py); optional.",
    .m_size = 0,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__trace_c(void)
{
    return PyModule_Create(&module_def);
}
