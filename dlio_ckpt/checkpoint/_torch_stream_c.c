/* dlio_ckpt.checkpoint._torch_stream_c: filebuf.FilebufStream and torch_archive.ArchiveNamed in
one C type, TorchStream, for the `torch` format's save (formats.TorchFormat).

Why C: torch.save hands its stream every piece of every zip record, five calls a record (local
header, name, extra field, data, data descriptor: ~600 for a 112-tensor state dict), each through
pybind11 to the stream's `write`. torch.save into a path makes those calls to a C++ std::ofstream;
the two Python layers that stand for it here (the records' renaming, then libstdc++'s buffering)
cost ~1.5 us a call, 2.9 ms of a 9.8 MB save that takes torch.save 11.6 ms
(benchmarks/README.md, "torch.save's cost per save"). That is the emulator's own time inside the
timed save, not the program's. Here a call costs what pybind11's call costs; the system calls
(and their recording) are the handle's, called from here exactly as the Python classes call
them: writev([what the buffer holds, the new bytes]) for a piece of 1 KiB or more, the new bytes
straight from the caller's memory; write(what is left) on flush.

The behaviour is the two Python classes' (their docstrings explain the formats), checked equal
call for call and byte for byte in tests/test_torch_stream_c.py; they stay the reference and the
fallback where this module is not built. No module state: each stream holds its own. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define FILEBUF_BYTES 8192
#define FILEBUF_ROOM (FILEBUF_BYTES - 1)
#define DIRECT_WRITE_BYTES 1024

enum { TOP, NAME, EXTRA, BODY };

static const char LOCAL[4] = {'P', 'K', 3, 4};
static const char DESCRIPTOR[4] = {'P', 'K', 7, 8};
static const char CENTRAL[4] = {'P', 'K', 1, 2};
static const char END64[4] = {'P', 'K', 6, 6};
static const char LOCATOR64[4] = {'P', 'K', 6, 7};
static const char END[4] = {'P', 'K', 5, 6};
static const char STREAM_NAME[] = "archive/";
#define STREAM_NAME_LEN 8

typedef struct {
    PyObject_HEAD
    PyObject *handle;
    PyObject *writev;  /* the handle's writev, or NULL */
    PyObject *write;   /* write_stream where the handle has it, else write */
    PyObject *buffer;  /* bytearray(FILEBUF_BYTES): libstdc++'s put area */
    Py_ssize_t fill;
    int closed;
    /* renaming (rename == 0: a plain FilebufStream) */
    int rename;
    char *stem;  /* the new folder name with its '/' */
    Py_ssize_t stem_len;
    uint64_t alignment;
    uint64_t in, out;
    int state;
    unsigned char header[30];
    char *name;
    Py_ssize_t name_len, name_cap;
    uint64_t body;
    uint64_t central_offset, central_size, end64;
    uint64_t *moved;  /* pairs (offset in torch's bytes, offset in the file), in write order */
    Py_ssize_t moved_n, moved_cap;
} TorchStream;

static uint16_t get16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const unsigned char *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24); }
static uint64_t get64(const unsigned char *p) { return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32); }
static void put16(unsigned char *p, uint16_t v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); }
static void put32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }

/* the handle's call with one argument; a new reference, or NULL with the error set */
static PyObject *
call1(PyObject *callable, PyObject *arg)
{
    return PyObject_CallOneArg(callable, arg);
}

/* what the buffer holds as a memoryview over the bytearray (the export keeps it alive) */
static PyObject *
pending_view(TorchStream *self)
{
    PyObject *whole = PyMemoryView_FromObject(self->buffer);
    if (whole == NULL)
        return NULL;
    PyObject *part = PySequence_GetSlice(whole, 0, self->fill);
    Py_DECREF(whole);
    return part;
}

/* a byte view of `data` for the handle: `data` itself when it is one already (torch's pieces are
   1-D unsigned-byte memoryviews), else memoryview(data).cast("B") */
static PyObject *
byte_view(PyObject *data)
{
    PyObject *view = PyMemoryView_FromObject(data);
    if (view == NULL)
        return NULL;
    Py_buffer *b = PyMemoryView_GET_BUFFER(view);
    if (b->ndim == 1 && b->itemsize == 1 && (b->format == NULL || strcmp(b->format, "B") == 0))
        return view;
    PyObject *cast = PyObject_CallMethod(view, "cast", "s", "B");
    Py_DECREF(view);
    return cast;
}

/* libstdc++'s xsputn: a small piece into the buffer; a piece of 1 KiB or more, or one the buffer
   has no room for, out at once with what the buffer holds. `obj` is the piece as a Python object
   when it is the caller's (zero copy), NULL when it was built here (then copied into a bytes). */
static int
filebuf_put(TorchStream *self, const char *data, Py_ssize_t size, PyObject *obj)
{
    if (size < DIRECT_WRITE_BYTES && size < FILEBUF_ROOM - self->fill) {
        memcpy(PyByteArray_AS_STRING(self->buffer) + self->fill, data, (size_t)size);
        self->fill += size;
        self->out += (uint64_t)size;
        return 0;
    }
    PyObject *view = obj != NULL ? byte_view(obj) : PyBytes_FromStringAndSize(data, size);
    if (view == NULL)
        return -1;
    PyObject *pending = pending_view(self);
    if (pending == NULL) {
        Py_DECREF(view);
        return -1;
    }
    PyObject *result = NULL;
    if (self->writev != NULL) {
        PyObject *list = PyList_New(2);
        if (list != NULL) {
            PyList_SET_ITEM(list, 0, pending);
            PyList_SET_ITEM(list, 1, view);
            result = call1(self->writev, list);
            Py_DECREF(list);
        } else {
            Py_DECREF(pending);
            Py_DECREF(view);
        }
    } else {  /* libstdc++ without writev: the buffer, then the new bytes */
        result = Py_None;
        Py_INCREF(result);
        if (self->fill) {
            Py_DECREF(result);
            result = call1(self->write, pending);
        }
        Py_DECREF(pending);
        if (result != NULL) {
            Py_DECREF(result);
            result = call1(self->write, view);
        }
        Py_DECREF(view);
    }
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    self->fill = 0;
    self->out += (uint64_t)size;
    return 0;
}

static int
moved_add(TorchStream *self, uint64_t in, uint64_t out)
{
    if (self->moved_n == self->moved_cap) {
        Py_ssize_t cap = self->moved_cap ? self->moved_cap * 2 : 256;
        uint64_t *grown = PyMem_Realloc(self->moved, (size_t)cap * 2 * sizeof(uint64_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->moved = grown;
        self->moved_cap = cap;
    }
    self->moved[2 * self->moved_n] = in;
    self->moved[2 * self->moved_n + 1] = out;
    self->moved_n++;
    return 0;
}

/* where the local header torch wrote at `in` now is (the offsets grow: a binary search) */
static uint64_t
moved_get(TorchStream *self, uint64_t in)
{
    Py_ssize_t lo = 0, hi = self->moved_n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        uint64_t at = self->moved[2 * mid];
        if (at == in)
            return self->moved[2 * mid + 1];
        if (at < in)
            lo = mid + 1;
        else
            hi = mid;
    }
    return in;
}

/* `name` with torch's `archive/` replaced by the stem, into self->name */
static int
set_name(TorchStream *self, const char *name, Py_ssize_t len)
{
    int renamed = len >= STREAM_NAME_LEN && memcmp(name, STREAM_NAME, STREAM_NAME_LEN) == 0;
    Py_ssize_t need = renamed ? self->stem_len + len - STREAM_NAME_LEN : len;
    if (need > self->name_cap) {
        char *grown = PyMem_Realloc(self->name, (size_t)need);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->name = grown;
        self->name_cap = need;
    }
    if (renamed) {
        memcpy(self->name, self->stem, (size_t)self->stem_len);
        memcpy(self->name + self->stem_len, name + STREAM_NAME_LEN, (size_t)(len - STREAM_NAME_LEN));
    } else {
        memcpy(self->name, name, (size_t)len);
    }
    self->name_len = need;
    return 0;
}

/* the header, name and extra field, torch's padding block recomputed for the new position */
static int
emit_header(TorchStream *self, const unsigned char *extra, Py_ssize_t extra_len)
{
    unsigned char *out = NULL;
    Py_ssize_t kept = 0, at = 0, length = extra_len;
    if (extra_len > 0) {
        out = PyMem_Malloc((size_t)extra_len + 4 + (size_t)self->alignment);
        if (out == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        while (at + 4 <= extra_len) {
            Py_ssize_t block = 4 + get16(extra + at + 2);
            if (!(extra[at] == 'F' && extra[at + 1] == 'B')) {
                Py_ssize_t take = at + block <= extra_len ? block : extra_len - at;
                memcpy(out + kept, extra + at, (size_t)take);
                kept += take;
            }
            at += block;
        }
        if (kept < extra_len) {  /* torch padded it: pad again for the new position */
            uint64_t start = self->out + 30 + (uint64_t)self->name_len + (uint64_t)kept + 4;
            uint64_t pad = (self->alignment - start % self->alignment) % self->alignment;
            out[kept] = 'F';
            out[kept + 1] = 'B';
            put16(out + kept + 2, (uint16_t)pad);
            memset(out + kept + 4, 'Z', (size_t)pad);
            length = kept + 4 + (Py_ssize_t)pad;
        } else {
            memcpy(out, extra, (size_t)extra_len);
        }
    }
    put16(self->header + 26, (uint16_t)self->name_len);
    put16(self->header + 28, (uint16_t)length);
    int failed = filebuf_put(self, (const char *)self->header, 30, NULL) < 0
        || filebuf_put(self, self->name, self->name_len, NULL) < 0
        || (length > 0 && filebuf_put(self, (const char *)out, length, NULL) < 0);
    PyMem_Free(out);
    return failed ? -1 : 0;
}

/* the local header's offset in an entry's zip64 extra block (after the sizes it holds) */
static void
move_zip64_offset(TorchStream *self, const unsigned char *fixed, unsigned char *extra, Py_ssize_t len)
{
    Py_ssize_t at = 0;
    while (at + 4 <= len) {
        uint16_t id = get16(extra + at), length = get16(extra + at + 2);
        if (id == 0x0001) {
            Py_ssize_t field = at + 4 + 8 * ((get32(fixed + 24) == 0xFFFFFFFFu) + (get32(fixed + 20) == 0xFFFFFFFFu));
            if (field + 8 <= len)
                put64(extra + field, moved_get(self, get64(extra + field)));
            return;
        }
        at += 4 + length;
    }
}

/* every entry of the central directory renamed, its local header's offset moved */
static int
central_directory(TorchStream *self, const unsigned char *table, Py_ssize_t len)
{
    /* each entry grows by at most the stem's length over torch's name */
    Py_ssize_t entries = len / 46 + 1;
    unsigned char *out = PyMem_Malloc((size_t)len + (size_t)entries * (size_t)self->stem_len + 1);
    if (out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t at = 0, n = 0;
    while (at + 46 <= len && memcmp(table + at, CENTRAL, 4) == 0) {
        Py_ssize_t name_len = get16(table + at + 28), extra_len = get16(table + at + 30);
        Py_ssize_t comment_len = get16(table + at + 32);
        if (at + 46 + name_len + extra_len + comment_len > len)
            break;  /* a torn entry: passed on as it is, with the rest */
        unsigned char *fixed = out + n;
        memcpy(fixed, table + at, 46);
        if (set_name(self, (const char *)table + at + 46, name_len) < 0) {
            PyMem_Free(out);
            return -1;
        }
        Py_ssize_t pos = n + 46;
        memcpy(out + pos, self->name, (size_t)self->name_len);
        pos += self->name_len;
        unsigned char *extra = out + pos;
        memcpy(extra, table + at + 46 + name_len, (size_t)extra_len);
        pos += extra_len;
        memcpy(out + pos, table + at + 46 + name_len + extra_len, (size_t)comment_len);
        pos += comment_len;
        uint32_t offset = get32(fixed + 42);
        if (offset == 0xFFFFFFFFu)
            move_zip64_offset(self, fixed, extra, extra_len);
        else
            put32(fixed + 42, (uint32_t)moved_get(self, offset));
        put16(fixed + 28, (uint16_t)self->name_len);
        n = pos;
        at += 46 + name_len + extra_len + comment_len;
    }
    memcpy(out + n, table + at, (size_t)(len - at));
    n += len - at;
    self->central_offset = self->out;
    self->central_size = (uint64_t)n;
    int failed = filebuf_put(self, (const char *)out, n, NULL);
    PyMem_Free(out);
    return failed;
}

/* whether the piece is the record's data descriptor: its size field equals the data so far */
static int
described(TorchStream *self, const unsigned char *p, Py_ssize_t size)
{
    uint64_t recorded = size == 24 ? get64(p + 16) : get32(p + 12);
    return recorded == self->body;
}

static PyObject *
TorchStream_write(TorchStream *self, PyObject *data)
{
    if (self->closed) {
        PyErr_SetString(PyExc_ValueError, "write to closed file");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t size = view.len;
    int failed = 0;
    if (!self->rename) {
        failed = filebuf_put(self, (const char *)p, size, data);
    } else if (self->state == NAME) {
        failed = set_name(self, (const char *)p, size);
        if (!failed) {
            self->state = get16(self->header + 28) ? EXTRA : BODY;
            if (self->state == BODY)
                failed = emit_header(self, NULL, 0);
        }
    } else if (self->state == EXTRA) {
        failed = emit_header(self, p, size);
        self->state = BODY;
    } else if (self->state == BODY) {
        int descriptor = (size == 16 || size == 24) && memcmp(p, DESCRIPTOR, 4) == 0 && described(self, p, size);
        if (!descriptor)
            self->body += (uint64_t)size;
        failed = filebuf_put(self, (const char *)p, size, data);
        if (descriptor)
            self->state = TOP;
    } else if (size == 30 && memcmp(p, LOCAL, 4) == 0) {
        failed = moved_add(self, self->in, self->out);
        memcpy(self->header, p, 30);
        self->body = 0;
        self->state = NAME;
    } else if (size >= 4 && memcmp(p, CENTRAL, 4) == 0) {
        failed = central_directory(self, p, size);
    } else if (size == 56 && memcmp(p, END64, 4) == 0) {
        unsigned char record[56];
        memcpy(record, p, 56);
        self->end64 = self->out;
        put64(record + 40, self->central_size);
        put64(record + 48, self->central_offset);
        failed = filebuf_put(self, (const char *)record, 56, NULL);
    } else if (size == 20 && memcmp(p, LOCATOR64, 4) == 0) {
        unsigned char record[20];
        memcpy(record, p, 20);
        put64(record + 8, self->end64);
        failed = filebuf_put(self, (const char *)record, 20, NULL);
    } else if (size >= 22 && memcmp(p, END, 4) == 0) {
        unsigned char *record = PyMem_Malloc((size_t)size);
        if (record == NULL) {
            PyErr_NoMemory();
            failed = -1;
        } else {
            memcpy(record, p, (size_t)size);
            put32(record + 12, self->central_size > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)self->central_size);
            put32(record + 16, self->central_offset > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)self->central_offset);
            failed = filebuf_put(self, (const char *)record, size, NULL);
            PyMem_Free(record);
        }
    } else {
        failed = filebuf_put(self, (const char *)p, size, data);
    }
    self->in += (uint64_t)size;
    PyBuffer_Release(&view);
    if (failed)
        return NULL;
    return PyLong_FromSsize_t(size);
}

static PyObject *
TorchStream_flush(TorchStream *self, PyObject *Py_UNUSED(ignored))
{
    if (self->fill) {  /* the ofstream's close: what the buffer holds, in one write() */
        PyObject *pending = pending_view(self);
        if (pending == NULL)
            return NULL;
        PyObject *result = call1(self->write, pending);
        Py_DECREF(pending);
        if (result == NULL)
            return NULL;
        Py_DECREF(result);
        self->fill = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *
TorchStream_close(TorchStream *self, PyObject *Py_UNUSED(ignored))
{
    self->fill = 0;  /* dropped without torch's final flush (a failed save): nothing more is written */
    self->closed = 1;
    Py_RETURN_NONE;
}

static PyObject *
TorchStream_tell(TorchStream *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *at = PyObject_CallMethod(self->handle, "tell", NULL);
    if (at == NULL)
        return NULL;
    PyObject *fill = PyLong_FromSsize_t(self->fill);
    PyObject *sum = fill == NULL ? NULL : PyNumber_Add(at, fill);
    Py_DECREF(at);
    Py_XDECREF(fill);
    return sum;
}

static PyObject *
TorchStream_true(TorchStream *self, PyObject *Py_UNUSED(ignored))
{
    Py_RETURN_TRUE;
}

static PyObject *
TorchStream_false(TorchStream *self, PyObject *Py_UNUSED(ignored))
{
    Py_RETURN_FALSE;
}

static PyObject *
TorchStream_get_closed(TorchStream *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->closed);
}

static int
TorchStream_init(TorchStream *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"handle", "stem", "alignment", NULL};
    PyObject *handle;
    const char *stem = "";
    Py_ssize_t stem_len = 0;
    unsigned long long alignment = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|s#K", keywords, &handle, &stem, &stem_len, &alignment))
        return -1;
    if (alignment == 0) {
        PyErr_SetString(PyExc_ValueError, "alignment must be positive");
        return -1;
    }
    Py_INCREF(handle);
    Py_XSETREF(self->handle, handle);
    PyObject *writev = PyObject_GetAttrString(handle, "writev");
    if (writev == NULL)
        PyErr_Clear();
    Py_XSETREF(self->writev, writev);
    PyObject *write = PyObject_GetAttrString(handle, "write_stream");
    if (write == NULL) {
        PyErr_Clear();
        write = PyObject_GetAttrString(handle, "write");
        if (write == NULL)
            return -1;
    }
    Py_XSETREF(self->write, write);
    PyObject *buffer = PyByteArray_FromStringAndSize(NULL, FILEBUF_BYTES);
    if (buffer == NULL)
        return -1;
    Py_XSETREF(self->buffer, buffer);
    self->fill = 0;
    self->closed = 0;
    self->rename = stem_len > 0;
    PyMem_Free(self->stem);
    self->stem = NULL;
    self->stem_len = 0;
    if (self->rename) {
        self->stem = PyMem_Malloc((size_t)stem_len + 1);
        if (self->stem == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(self->stem, stem, (size_t)stem_len);
        self->stem[stem_len] = '/';
        self->stem_len = stem_len + 1;
    }
    self->alignment = alignment;
    self->in = self->out = 0;
    self->state = TOP;
    self->body = 0;
    self->central_offset = self->central_size = self->end64 = 0;
    self->moved_n = 0;
    return 0;
}

static void
TorchStream_dealloc(TorchStream *self)
{
    Py_XDECREF(self->handle);
    Py_XDECREF(self->writev);
    Py_XDECREF(self->write);
    Py_XDECREF(self->buffer);
    PyMem_Free(self->stem);
    PyMem_Free(self->name);
    PyMem_Free(self->moved);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef TorchStream_methods[] = {
    {"write", (PyCFunction)TorchStream_write, METH_O, "torch's piece: renamed, buffered or written as libstdc++ does"},
    {"flush", (PyCFunction)TorchStream_flush, METH_NOARGS, "the ofstream's close: the buffer in one write()"},
    {"close", (PyCFunction)TorchStream_close, METH_NOARGS, "dropped without a flush: nothing more is written"},
    {"tell", (PyCFunction)TorchStream_tell, METH_NOARGS, "the handle's offset plus what the buffer holds"},
    {"writable", (PyCFunction)TorchStream_true, METH_NOARGS, NULL},
    {"readable", (PyCFunction)TorchStream_false, METH_NOARGS, NULL},
    {"seekable", (PyCFunction)TorchStream_false, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef TorchStream_getset[] = {
    {"closed", (getter)TorchStream_get_closed, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TorchStreamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dlio_ckpt.checkpoint._torch_stream_c.TorchStream",
    .tp_doc = PyDoc_STR("TorchStream(handle, stem='', alignment=64): FilebufStream, renaming as ArchiveNamed when stem is given"),
    .tp_basicsize = sizeof(TorchStream),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)TorchStream_init,
    .tp_dealloc = (destructor)TorchStream_dealloc,
    .tp_methods = TorchStream_methods,
    .tp_getset = TorchStream_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_torch_stream_c",
    .m_doc = "torch.save's stream (filebuf.FilebufStream + torch_archive.ArchiveNamed) in C",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__torch_stream_c(void)
{
    if (PyType_Ready(&TorchStreamType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TorchStreamType);
    if (PyModule_AddObject(m, "TorchStream", (PyObject *)&TorchStreamType) < 0) {
        Py_DECREF(&TorchStreamType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
