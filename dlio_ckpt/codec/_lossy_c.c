/* dlio_ckpt.codec._lossy_c: the LC-Checkpoint codec's per-element loops (codec/lossy_kernels.py,
codec/huffman.py) in C.

Why C: in numpy every step of the codec is a pass over a segment with its own float64 temporary
(delta, bucket ids, ufunc.at for the minima and maxima, the representatives gathered, the cast,
the error), and the Huffman decoder steps through a lane's symbols one numpy call at a time, a
fixed ~7 ms per tensor however small (benchmarks/README.md, "LC-Checkpoint at speed"). Here each
pass is one loop that reads the tensor's own bytes and keeps everything in registers.

Every function computes exactly what its numpy counterpart in lossy_kernels.py / huffman.py
computes, bit for bit (tests/test_lossy_speed.py compares them): float64 arithmetic (SSE2, round
to nearest even), the same bucket ids (the top 12 + m bits of the float64 delta), the same casts
back into the tensor's format (IEEE float16 and float32 round once from float64, as numpy's astype;
bfloat16 rounds to float32 then to its top 16 bits, to nearest even, as torch does). The loops
run without the GIL. The module has no state. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__FLT16_MAX__)
#define HAVE_FLOAT16 1
#else
#define HAVE_FLOAT16 0
#endif

/* float formats, as lossy_kernels.FORMATS numbers them */
enum { FMT_F16 = 0, FMT_BF16 = 1, FMT_F32 = 2, FMT_F64 = 3 };
#define HIST_BINS 1025          /* bin 0: exact; then 1/16 binades from 2^-40 (lossy_kernels.HIST_*) */
#define HIST_OFFSET (983 * 16)  /* (1023 - 40) << 4: the float64 bits >> 48 of 2^-40 */

static const int FMT_SIZE[4] = {2, 2, 4, 8};

static inline uint64_t bits_of(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }

static inline __attribute__((always_inline)) double
load(const char *base, Py_ssize_t i, int fmt)
{
    switch (fmt) {
#if HAVE_FLOAT16
    case FMT_F16: { _Float16 h; memcpy(&h, base + 2 * i, 2); return (double)h; }
#endif
    case FMT_BF16: { uint16_t b; memcpy(&b, base + 2 * i, 2); uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return (double)f; }
    case FMT_F32: { float f; memcpy(&f, base + 4 * i, 4); return (double)f; }
    default: { double d; memcpy(&d, base + 8 * i, 8); return d; }
    }
}

/* The value stored (the cast back into the tensor's format), as a double, written to `out`. */
static inline __attribute__((always_inline)) double
store(char *base, Py_ssize_t i, int fmt, double v)
{
    switch (fmt) {
#if HAVE_FLOAT16
    case FMT_F16: { _Float16 h = (_Float16)v; memcpy(base + 2 * i, &h, 2); return (double)h; }
#endif
    case FMT_BF16: {
        float f = (float)v;
        uint32_t u; memcpy(&u, &f, 4);
        u = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
        uint16_t b = (uint16_t)u; memcpy(base + 2 * i, &b, 2);
        u <<= 16; memcpy(&f, &u, 4);
        return (double)f;
    }
    case FMT_F32: { float f = (float)v; memcpy(base + 4 * i, &f, 4); return (double)f; }
    default: memcpy(base + 8 * i, &v, 8); return v;
    }
}

static int
check_fmt(int fmt)
{
    if (fmt < 0 || fmt > 3 || (fmt == FMT_F16 && !HAVE_FLOAT16)) {
        PyErr_Format(PyExc_ValueError, "float format %d is not handled here", fmt);
        return -1;
    }
    return 0;
}

static int
check_size(Py_buffer *b, Py_ssize_t want, const char *what)
{
    if (b->len != want) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, expected %zd", what, b->len, want);
        return -1;
    }
    return 0;
}

/* scan(x, previous, fmt, mantissa_bits, counts, lo, hi) -> bool: pass 1 of one segment. Adds
   every delta x - previous (float64) into its bucket's count, minimum and maximum (dense tables of
   4096 << m entries, updated in place); False, as soon as a delta is not finite. */
static PyObject *
scan(PyObject *self, PyObject *args)
{
    Py_buffer x, prev, counts, lo, hi;
    int fmt, m;
    if (!PyArg_ParseTuple(args, "y*y*iiw*w*w*", &x, &prev, &fmt, &m, &counts, &lo, &hi))
        return NULL;
    PyObject *result = NULL;
    if (check_fmt(fmt) < 0 || m < 0 || m > 10)
        goto done;
    Py_ssize_t n = x.len / FMT_SIZE[fmt], nb = (Py_ssize_t)4096 << m;
    if (check_size(&x, n * FMT_SIZE[fmt], "x") < 0 || check_size(&prev, x.len, "previous") < 0
        || check_size(&counts, 8 * nb, "counts") < 0 || check_size(&lo, 8 * nb, "lo") < 0 || check_size(&hi, 8 * nb, "hi") < 0)
        goto done;
    int finite = 1;
    Py_BEGIN_ALLOW_THREADS
    int64_t *c = counts.buf;
    double *l = lo.buf, *h = hi.buf;
    const int shift = 52 - m;
    const uint64_t mask = (uint64_t)nb - 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        double d = load(x.buf, i, fmt) - load(prev.buf, i, fmt);
        if (!isfinite(d)) { finite = 0; break; }
        uint64_t b = (bits_of(d) >> shift) & mask;
        c[b]++;
        if (d < l[b]) l[b] = d;
        if (d > h[b]) h[b] = d;
    }
    Py_END_ALLOW_THREADS
    result = PyBool_FromLong(finite);
done:
    PyBuffer_Release(&x); PyBuffer_Release(&prev); PyBuffer_Release(&counts); PyBuffer_Release(&lo); PyBuffer_Release(&hi);
    return result;
}

typedef struct {
    const char *x, *prev;
    char *out;
    const uint8_t *tab;
    const double *r;
    uint8_t *s;
    int64_t *hist;
    Py_ssize_t n;
    int shift;
    uint64_t mask;
    Py_ssize_t kept, zero_changed;
    double max_err, sq_err, sq_x, max_x, largest, max_rel;
} quantise_state;

static inline __attribute__((always_inline)) void
quantise_loop(quantise_state *q, const int fmt)
{
    Py_ssize_t kept = 0, zero_changed = 0;
    double max_err = 0, sq_err = 0, sq_x = 0, max_x = 0, largest = 0, max_rel = 0;
    for (Py_ssize_t i = 0; i < q->n; i++) {
        double xi = load(q->x, i, fmt), pi = load(q->prev, i, fmt);
        uint8_t k = q->tab[(bits_of(xi - pi) >> q->shift) & q->mask];
        q->s[i] = k;
        kept += k != 0;
        double ni = store(q->out, i, fmt, pi + q->r[k]);
        double e = xi - ni, ax = fabs(xi), ae = fabs(e);
        sq_err += e * e;
        sq_x += xi * xi;
        if (ae > max_err) max_err = ae;
        if (ax > max_x) max_x = ax;
        if (fabs(pi) > largest) largest = fabs(pi);
        if (fabs(ni) > largest) largest = fabs(ni);
        if (ax == 0) {
            if (ni != 0) zero_changed++;
            else q->hist[0]++;
        } else if (ae == 0) {
            q->hist[0]++;
        } else {
            double rel = ae / ax;
            if (rel > max_rel) max_rel = rel;
            int64_t b = (int64_t)((bits_of(rel) >> 48) & 0x7FFF) - HIST_OFFSET;
            q->hist[1 + (b < 0 ? 0 : b > HIST_BINS - 2 ? HIST_BINS - 2 : b)]++;
        }
    }
    q->kept = kept; q->zero_changed = zero_changed; q->max_err = max_err; q->sq_err = sq_err; q->sq_x = sq_x;
    q->max_x = max_x; q->largest = largest; q->max_rel = max_rel;
}

/* quantise(x, previous, fmt, mantissa_bits, symbol_of_bucket, representatives, symbols, new, hist)
   -> (kept, max_err, sq_err, sq_x, max_abs_x, largest, zero_changed, max_rel): pass 2 of a segment.
   symbols[i] = symbol_of_bucket[bucket of the delta], new[i] = cast(previous + representatives
   [symbols[i]]) in the tensor's format; the error sums of x - new, max |x|, max(|x|, |previous|,
   |new|), and the per-element relative error |x - new| / |x| counted into `hist` (int64 x
   HIST_BINS, added to; elements with x = 0 are counted in zero_changed when new != 0, else as
   exact) with its maximum, max_rel. */
static PyObject *
quantise(PyObject *self, PyObject *args)
{
    Py_buffer x, prev, table, reps, sym, out, hist;
    int fmt, m;
    if (!PyArg_ParseTuple(args, "y*y*iiy*y*w*w*w*", &x, &prev, &fmt, &m, &table, &reps, &sym, &out, &hist))
        return NULL;
    PyObject *result = NULL;
    if (check_fmt(fmt) < 0 || m < 0 || m > 10)
        goto done;
    Py_ssize_t n = x.len / FMT_SIZE[fmt], nb = (Py_ssize_t)4096 << m, nsym = reps.len / 8;
    if (check_size(&x, n * FMT_SIZE[fmt], "x") < 0 || check_size(&prev, x.len, "previous") < 0
        || check_size(&table, nb, "symbol_of_bucket") < 0 || check_size(&sym, n, "symbols") < 0
        || check_size(&out, x.len, "new") < 0 || check_size(&hist, 8 * HIST_BINS, "hist") < 0)
        goto done;
    if (nsym < 1 || nsym > 256 || reps.len != 8 * nsym) {
        PyErr_SetString(PyExc_ValueError, "representatives: 1 to 256 float64 values expected");
        goto done;
    }
    const uint8_t *tab = table.buf;
    for (Py_ssize_t b = 0; b < nb; b++) {
        if (tab[b] >= nsym) {
            PyErr_SetString(PyExc_ValueError, "symbol_of_bucket names a symbol past the representatives");
            goto done;
        }
    }
    Py_ssize_t kept = 0, zero_changed = 0;
    double max_err = 0, sq_err = 0, sq_x = 0, max_x = 0, largest = 0, max_rel = 0;
    Py_BEGIN_ALLOW_THREADS
    quantise_state q = {x.buf, prev.buf, out.buf, tab, reps.buf, sym.buf, hist.buf, n, 52 - m, (uint64_t)nb - 1,
                        0, 0, 0, 0, 0, 0, 0, 0};
    switch (fmt) {  /* one loop per format, so that the format's load and store are inlined */
    case FMT_F16: quantise_loop(&q, FMT_F16); break;
    case FMT_BF16: quantise_loop(&q, FMT_BF16); break;
    case FMT_F32: quantise_loop(&q, FMT_F32); break;
    default: quantise_loop(&q, FMT_F64); break;
    }
    kept = q.kept; zero_changed = q.zero_changed; max_err = q.max_err; sq_err = q.sq_err; sq_x = q.sq_x;
    max_x = q.max_x; largest = q.largest; max_rel = q.max_rel;
    if (max_x > largest) largest = max_x;
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(ndddddnd)", kept, max_err, sq_err, sq_x, max_x, largest, zero_changed, max_rel);
done:
    PyBuffer_Release(&x); PyBuffer_Release(&prev); PyBuffer_Release(&table); PyBuffer_Release(&reps);
    PyBuffer_Release(&sym); PyBuffer_Release(&out); PyBuffer_Release(&hist);
    return result;
}

/* apply(state, fmt, symbols, representatives): state[i] = cast(state[i] + representatives
   [symbols[i]]) in place, the decoder's replay of one segment (lossy.apply_delta). */
static PyObject *
apply(PyObject *self, PyObject *args)
{
    Py_buffer state, sym, reps;
    int fmt;
    if (!PyArg_ParseTuple(args, "w*iy*y*", &state, &fmt, &sym, &reps))
        return NULL;
    PyObject *result = NULL;
    if (check_fmt(fmt) < 0)
        goto done;
    Py_ssize_t n = sym.len, nsym = reps.len / 8;
    if (check_size(&state, n * FMT_SIZE[fmt], "state") < 0)
        goto done;
    if (nsym < 1 || nsym > 256 || reps.len != 8 * nsym) {
        PyErr_SetString(PyExc_ValueError, "representatives: 1 to 256 float64 values expected");
        goto done;
    }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *s = sym.buf;
    const double *r = reps.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] >= nsym) { bad = 1; break; }
        store(state.buf, i, fmt, load(state.buf, i, fmt) + r[s[i]]);
    }
    Py_END_ALLOW_THREADS
    if (bad)
        PyErr_SetString(PyExc_ValueError, "a symbol outside the representatives");
    else
        result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&state); PyBuffer_Release(&sym); PyBuffer_Release(&reps);
    return result;
}

/* huff_encode(symbols, codes, lengths, lane, lane_bits, item) -> bytes: the canonical codes
   (uint32 x 256, right-aligned) of uint8 symbols, MSB first, zero-padded to a byte; each lane's
   bit length written into lane_bits (uint16 or uint32: item 2 or 4). huffman.encode's stream:
   empty when no symbol has a code (one symbol), a ValueError when only some have none. */
static PyObject *
huff_encode(PyObject *self, PyObject *args)
{
    Py_buffer sym, codes, lengths, lane_bits;
    Py_ssize_t lane;
    int item;
    if (!PyArg_ParseTuple(args, "y*y*y*nw*i", &sym, &codes, &lengths, &lane, &lane_bits, &item))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = sym.len, nlanes = lane > 0 ? (n + lane - 1) / lane : 0;
    if (lane < 1 || codes.len != 4 * 256 || lengths.len != 256 || (item != 2 && item != 4) || lane_bits.len != nlanes * item) {
        PyErr_SetString(PyExc_ValueError, "huff_encode: tables of 256 codes and lengths, one lane length per lane");
        goto done;
    }
    const uint8_t *s = sym.buf, *len = lengths.buf;
    const uint32_t *code = codes.buf;
    uint64_t total = 0;
    Py_ssize_t uncoded = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        total += len[s[i]];
        uncoded += len[s[i]] == 0;
    }
    if (uncoded && total) {
        PyErr_SetString(PyExc_ValueError, "a symbol to encode has no code (its count was 0 when the code was built)");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((total + 7) / 8));
    if (result == NULL)
        goto done;
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    uint64_t acc = 0;  /* pending bits, right-aligned */
    int pending = 0;
    Py_ssize_t at = 0;
    for (Py_ssize_t l = 0; l < nlanes; l++) {
        Py_ssize_t end = (l + 1) * lane < n ? (l + 1) * lane : n;
        uint32_t bits = 0;
        for (Py_ssize_t i = l * lane; i < end; i++) {
            int w = len[s[i]];
            bits += w;
            acc = (acc << w) | code[s[i]];
            pending += w;
            if (pending >= 32) {  /* codes are at most 15 bits: pending stays below 47 */
                pending -= 32;
                uint32_t v = (uint32_t)(acc >> pending);
                dst[at] = (uint8_t)(v >> 24); dst[at + 1] = (uint8_t)(v >> 16);
                dst[at + 2] = (uint8_t)(v >> 8); dst[at + 3] = (uint8_t)v;
                at += 4;
            }
        }
        if (item == 2) ((uint16_t *)lane_bits.buf)[l] = (uint16_t)bits;
        else ((uint32_t *)lane_bits.buf)[l] = bits;
    }
    while (pending >= 8) {
        pending -= 8;
        dst[at++] = (uint8_t)(acc >> pending);
    }
    if (pending)
        dst[at++] = (uint8_t)(acc << (8 - pending));
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&sym); PyBuffer_Release(&codes); PyBuffer_Release(&lengths); PyBuffer_Release(&lane_bits);
    return result;
}

/* huff_decode(data, lane_bits, item, table_sym, table_len, width, lane, out): decodes the stream's lanes
   into out (uint8 x n) with the `width`-bit lookup tables of huffman._decode_table; bytes past
   the stream read as zeros. ValueError when a lane does not end at its stored bit length (the
   check huffman.decode makes). */
static PyObject *
huff_decode(PyObject *self, PyObject *args)
{
    Py_buffer data, lane_bits, tsym, tlen, out;
    int width, item;
    Py_ssize_t lane;
    if (!PyArg_ParseTuple(args, "y*y*iy*y*inw*", &data, &lane_bits, &item, &tsym, &tlen, &width, &lane, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = out.len, nlanes = lane > 0 ? (n + lane - 1) / lane : 0;
    if (lane < 1 || width < 1 || width > 24 || tsym.len != ((Py_ssize_t)1 << width) || tlen.len != tsym.len
        || (item != 2 && item != 4) || lane_bits.len != nlanes * item) {
        PyErr_SetString(PyExc_ValueError, "huff_decode: tables of 2^width entries, one lane length per lane");
        goto done;
    }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *buf = data.buf, *ts = tsym.buf, *tl = tlen.buf;
    uint8_t *o = out.buf;
    const Py_ssize_t nbytes = data.len;
    uint64_t start = 0;
    const uint32_t wmask = ((uint32_t)1 << width) - 1;
    for (Py_ssize_t l = 0; l < nlanes && !bad; l++) {
        uint64_t bits = item == 2 ? ((const uint16_t *)lane_bits.buf)[l] : ((const uint32_t *)lane_bits.buf)[l];
        uint64_t pos = start;
        Py_ssize_t end = (l + 1) * lane < n ? (l + 1) * lane : n;
        for (Py_ssize_t i = l * lane; i < end; i++) {
            uint64_t byte = pos >> 3;
            uint32_t window = 0;
            for (int k = 0; k < 4; k++)
                window = (window << 8) | ((Py_ssize_t)(byte + k) < nbytes ? buf[byte + k] : 0);
            uint32_t c = (window >> (32 - width - (pos & 7))) & wmask;
            o[i] = ts[c];
            pos += tl[c];
        }
        if (pos != start + bits)
            bad = 1;
        start += bits;
    }
    Py_END_ALLOW_THREADS
    if (bad)
        PyErr_SetString(PyExc_ValueError, "the stream does not decode to its lanes' bit lengths");
    else
        result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&data); PyBuffer_Release(&lane_bits); PyBuffer_Release(&tsym); PyBuffer_Release(&tlen); PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "pass 1 of a segment: bucket counts, minima and maxima of its deltas"},
    {"quantise", quantise, METH_VARARGS, "pass 2 of a segment: symbols, the new state and its errors"},
    {"apply", apply, METH_VARARGS, "a segment's replay: state += representatives[symbols], cast back"},
    {"huff_encode", huff_encode, METH_VARARGS, "canonical Huffman bit stream of uint8 symbols"},
    {"huff_decode", huff_decode, METH_VARARGS, "decode a lane-structured canonical Huffman stream"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lossy_c", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC
PyInit__lossy_c(void)
{
    PyObject *mod = PyModule_Create(&module);
    if (mod != NULL && PyModule_AddIntConstant(mod, "HAVE_FLOAT16", HAVE_FLOAT16) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
