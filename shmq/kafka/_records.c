/* Kafka record batches' records in C, each function the twin of a Python one that stays as
 * the fallback (records.py's _decode_records_py and _encode_records_py, headers.py's
 * native_column_py and to_kafka(decode_headers(...))), held equal by tests/kafka/test_codec.py.
 *
 * encode_records(records, base_offset, base_ts) -> bytes: the records part of a batch
 * (uncompressed) of `records`, Record values (offset, timestamp, key, value, headers),
 * byte for byte the Python twin's.
 *
 * headers_column(headers, most) -> (data, int32 offsets as bytes) or None: Kafka headers of
 * each record ((str, bytes or None) pairs, () for none) as a binary column of native record
 * headers, each the msgpack bytes headers.py's native_column_py writes: a map when the keys
 * are unique and no value is null, else an array of [key, value] pairs. None where any
 * record's would pass `most` bytes or holds something else: the Python twin says why.
 *
 * kafka_headers(raw) -> tuple or None: a native record's encoded headers (msgpack: a map of str
 * to values, or an array of [str, value] pairs) as Kafka's (str, bytes or None) pairs, in
 * order, as headers.py's to_kafka(decode_headers(raw)) makes them, where every value is
 * null, bin or str; None for anything else (an int, float or bool value, repeated map keys,
 * bytes that are not one such map or array): the Python twin then says what it is.
 *
 * decode_records(buf, count, base_ts) -> (timestamps, offset deltas, keys, values, headers),
 * five lists of one entry per record, equal to the Python twin's for every input: a key or
 * value is bytes or None, headers () or a tuple of (str, bytes or None) pairs. Anything
 * that is not `count` well-formed records filling `buf` raises ValueError with the words
 * the Python twin gives KafkaProtocolError (records.py adds "a record batch " and the code).
 * A varint is Kafka's zigzag varint of up to 10 bytes, read in 128 bits as Python's twin
 * reads it in its unbounded ints, so a long one's value (and its error's words) agree. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ decoding */
typedef __int128 i128;

typedef struct {
    const unsigned char *b;
    Py_ssize_t pos;
} Cursor;

/* Nonzero where a ValueError with `why` is set. */
static int corrupt(const char *why) {
    PyErr_SetString(PyExc_ValueError, why);
    return -1;
}

/* The decimal form of v into out (at least 48 bytes). */
static const char *i128_str(i128 v, char *out) {
    char tmp[48];
    int n = 0, neg = v < 0;
    unsigned __int128 u = neg ? -(unsigned __int128)v : (unsigned __int128)v;
    do {
        tmp[n++] = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u);
    int k = 0;
    if (neg)
        out[k++] = '-';
    while (n)
        out[k++] = tmp[--n];
    out[k] = 0;
    return out;
}

/* A zigzag varint at c->pos, before end: as records.py's _varint. */
static int varint(Cursor *c, Py_ssize_t end, i128 *out) {
    unsigned __int128 n = 0;
    int shift = 0;
    for (;;) {
        if (c->pos >= end || shift > 63)
            return corrupt("with a varint cut short or too long");
        unsigned char b = c->b[c->pos++];
        n |= (unsigned __int128)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = (i128)(n >> 1) ^ -(i128)(n & 1);
            return 0;
        }
        shift += 7;
    }
}

static PyObject *long_of(i128 v) {
    if (v >= INT64_MIN && v <= INT64_MAX)
        return PyLong_FromLongLong((long long)v);
    char s[48];
    return PyLong_FromString(i128_str(v, s), NULL, 10);
}

/* A length-prefixed field (-1: None) at c->pos, before end: a new reference, or NULL. */
static PyObject *field(Cursor *c, Py_ssize_t end) {
    i128 n;
    if (varint(c, end, &n) < 0)
        return NULL;
    if (n == -1)
        Py_RETURN_NONE;
    if (n < 0 || n > end - c->pos) {
        char a[48], b[48];
        PyErr_Format(PyExc_ValueError, "with a field of %s bytes where %s are left", i128_str(n, a),
                     i128_str(end - c->pos, b));
        return NULL;
    }
    PyObject *o = PyBytes_FromStringAndSize((const char *)c->b + c->pos, (Py_ssize_t)n);
    c->pos += (Py_ssize_t)n;
    return o;
}

/* A record's headers at c->pos (not its single 0 byte): a tuple of (str, bytes or None). */
static PyObject *headers(Cursor *c, Py_ssize_t end) {
    i128 nh;
    if (varint(c, end, &nh) < 0)
        return NULL;
    if (nh < 0 || nh > end - c->pos) {
        char a[48];
        PyErr_Format(PyExc_ValueError, "with a record of %s headers", i128_str(nh, a));
        return NULL;
    }
    PyObject *pairs = PyList_New(0);
    if (!pairs)
        return NULL;
    for (Py_ssize_t h = 0; h < (Py_ssize_t)nh; h++) {
        PyObject *hk = field(c, end);
        if (!hk)
            goto fail;
        PyObject *hv = field(c, end);
        if (!hv) {
            Py_DECREF(hk);
            goto fail;
        }
        if (hk == Py_None) {
            Py_DECREF(hk);
            Py_DECREF(hv);
            corrupt("with a header without a key");
            goto fail;
        }
        PyObject *key = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(hk), PyBytes_GET_SIZE(hk), "strict");
        Py_DECREF(hk);
        if (!key) {
            Py_DECREF(hv);
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                goto fail;
            PyErr_Clear();
            corrupt("with a header key that is not UTF-8");
            goto fail;
        }
        PyObject *pair = PyTuple_Pack(2, key, hv);
        Py_DECREF(key);
        Py_DECREF(hv);
        if (!pair || PyList_Append(pairs, pair) < 0) {
            Py_XDECREF(pair);
            goto fail;
        }
        Py_DECREF(pair);
    }
    PyObject *t = PyList_AsTuple(pairs);
    Py_DECREF(pairs);
    return t;
fail:
    Py_DECREF(pairs);
    return NULL;
}

static PyObject *decode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "decode_records(buf: bytes, count: int, base_ts: int)");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    long long base_ts = PyLong_AsLongLong(args[2]);
    if (base_ts == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    if (count < 0)
        return PyErr_Format(PyExc_ValueError, "that says %zd records", count);
    if (count > n) /* each record takes 7 bytes at least: no list sized by a lie */
        return PyErr_Format(PyExc_ValueError, "that says %zd records in %zd bytes", count, n);
    Cursor c = {(const unsigned char *)PyBytes_AS_STRING(args[0]), 0};
    PyObject *cols[5] = {NULL, NULL, NULL, NULL, NULL};
    PyObject *empty = PyTuple_New(0);
    if (!empty)
        return NULL;
    for (int i = 0; i < 5; i++)
        if (!(cols[i] = PyList_New(count)))
            goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        i128 length, t, d;
        if (varint(&c, n, &length) < 0)
            goto fail;
        if (length < 6 || length > n - c.pos) {
            char a[48];
            PyErr_Format(PyExc_ValueError, "with a record of %s bytes where %zd are left", i128_str(length, a),
                         n - c.pos);
            goto fail;
        }
        Py_ssize_t end = c.pos + (Py_ssize_t)length;
        c.pos++; /* the attributes (unused) */
        if (varint(&c, end, &t) < 0 || varint(&c, end, &d) < 0)
            goto fail;
        PyObject *o = long_of((i128)base_ts + t);
        if (!o)
            goto fail;
        PyList_SET_ITEM(cols[0], i, o);
        if (!(o = long_of(d)))
            goto fail;
        PyList_SET_ITEM(cols[1], i, o);
        if (c.pos < end && c.b[c.pos] == 1) { /* a null key: mostly */
            c.pos++;
            Py_INCREF(Py_None);
            o = Py_None;
        } else if (!(o = field(&c, end))) {
            goto fail;
        }
        PyList_SET_ITEM(cols[2], i, o);
        if (!(o = field(&c, end)))
            goto fail;
        PyList_SET_ITEM(cols[3], i, o);
        if (c.pos < end && c.b[c.pos] == 0) {
            c.pos++;
            Py_INCREF(empty);
            o = empty;
        } else if (!(o = headers(&c, end))) {
            goto fail;
        }
        PyList_SET_ITEM(cols[4], i, o);
        if (c.pos != end) {
            corrupt("with a record longer than its fields");
            goto fail;
        }
    }
    if (c.pos != n) {
        PyErr_Format(PyExc_ValueError, "with %zd bytes after its %zd records", n - c.pos, count);
        goto fail;
    }
    Py_DECREF(empty);
    return Py_BuildValue("(NNNNN)", cols[0], cols[1], cols[2], cols[3], cols[4]);
fail:
    Py_DECREF(empty);
    for (int i = 0; i < 5; i++)
        Py_XDECREF(cols[i]); /* (a list's unset items are NULL: list_dealloc skips them) */
    return NULL;
}

/* ------------------------------------------------------------------ encoding */
typedef struct {
    unsigned char *b;
    Py_ssize_t len, cap;
} Out;

static int out_room(Out *o, Py_ssize_t more) {
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : 256;
    while (cap < o->len + more)
        cap *= 2;
    unsigned char *b = PyMem_Realloc(o->b, cap);
    if (!b) {
        PyErr_NoMemory();
        return -1;
    }
    o->b = b;
    o->cap = cap;
    return 0;
}

static int put_zigzag(Out *o, int64_t n) {
    if (out_room(o, 10) < 0)
        return -1;
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    while (z & ~(uint64_t)0x7F) {
        o->b[o->len++] = (unsigned char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    o->b[o->len++] = (unsigned char)z;
    return 0;
}

/* bytes (any buffer) with its zigzag length, or None as -1 */
static int put_field(Out *o, PyObject *v) {
    if (v == Py_None) {
        if (out_room(o, 1) < 0)
            return -1;
        o->b[o->len++] = 1;
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(v, &view, PyBUF_SIMPLE) < 0)
        return -1;
    int rc = -1;
    if (put_zigzag(o, (int64_t)view.len) == 0 && out_room(o, view.len) == 0) {
        memcpy(o->b + o->len, view.buf, view.len);
        o->len += view.len;
        rc = 0;
    }
    PyBuffer_Release(&view);
    return rc;
}

static int64_t attr_i64(PyObject *r, PyObject *name, int *err) {
    PyObject *v = PyObject_GetAttr(r, name);
    if (!v) {
        *err = 1;
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        *err = 1;
    return x;
}

static PyObject *s_offset, *s_timestamp, *s_key, *s_value, *s_headers;

/* one record (its attributes byte on) into rec */
static int put_record(Out *rec, PyObject *r, int64_t base_offset, int64_t base_ts) {
    int err = 0;
    int64_t off = attr_i64(r, s_offset, &err), ts = attr_i64(r, s_timestamp, &err);
    if (err)
        return -1;
    int64_t dt, doff;
    if (__builtin_sub_overflow(ts, base_ts, &dt) || __builtin_sub_overflow(off, base_offset, &doff)) {
        PyErr_SetString(PyExc_OverflowError, "a record's timestamp or offset delta past 64 bits");
        return -1;
    }
    if (out_room(rec, 1) < 0)
        return -1;
    rec->b[rec->len++] = 0;
    if (put_zigzag(rec, dt) < 0 || put_zigzag(rec, doff) < 0)
        return -1;
    PyObject *v = PyObject_GetAttr(r, s_key);
    if (!v)
        return -1;
    int rc = put_field(rec, v);
    Py_DECREF(v);
    if (rc < 0 || !(v = PyObject_GetAttr(r, s_value)))
        return -1;
    rc = put_field(rec, v);
    Py_DECREF(v);
    if (rc < 0 || !(v = PyObject_GetAttr(r, s_headers)))
        return -1;
    PyObject *hs = PySequence_Fast(v, "a record's headers must be a sequence of (key, value) pairs");
    Py_DECREF(v);
    if (!hs)
        return -1;
    Py_ssize_t nh = PySequence_Fast_GET_SIZE(hs);
    rc = put_zigzag(rec, (int64_t)nh);
    for (Py_ssize_t h = 0; rc == 0 && h < nh; h++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(hs, h);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))) {
            PyErr_SetString(PyExc_TypeError, "a record's header must be a (str, bytes or None) pair");
            rc = -1;
            break;
        }
        PyObject *hk = PyUnicode_AsUTF8String(PyTuple_GET_ITEM(pair, 0));
        if (!hk) {
            rc = -1;
            break;
        }
        rc = put_field(rec, hk);
        Py_DECREF(hk);
        if (rc == 0)
            rc = put_field(rec, PyTuple_GET_ITEM(pair, 1));
    }
    Py_DECREF(hs);
    return rc;
}

static PyObject *encode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode_records(records, base_offset: int, base_ts: int)");
        return NULL;
    }
    long long base_offset = PyLong_AsLongLong(args[1]), base_ts;
    if (base_offset == -1 && PyErr_Occurred())
        return NULL;
    base_ts = PyLong_AsLongLong(args[2]);
    if (base_ts == -1 && PyErr_Occurred())
        return NULL;
    PyObject *records = PySequence_Fast(args[0], "records must be a sequence");
    if (!records)
        return NULL;
    Out body = {NULL, 0, 0}, rec = {NULL, 0, 0};
    PyObject *result = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(records);
    for (Py_ssize_t i = 0; i < n; i++) {
        rec.len = 0;
        if (put_record(&rec, PySequence_Fast_GET_ITEM(records, i), base_offset, base_ts) < 0)
            goto done;
        if (put_zigzag(&body, (int64_t)rec.len) < 0 || out_room(&body, rec.len) < 0)
            goto done;
        memcpy(body.b + body.len, rec.b, rec.len);
        body.len += rec.len;
    }
    result = PyBytes_FromStringAndSize((const char *)body.b, body.len);
done:
    PyMem_Free(body.b);
    PyMem_Free(rec.b);
    Py_DECREF(records);
    return result;
}

/* ------------------------------------------------------------------ native headers */
static int put_raw(Out *o, const void *p, Py_ssize_t n) {
    if (out_room(o, n) < 0)
        return -1;
    memcpy(o->b + o->len, p, n);
    o->len += n;
    return 0;
}

/* a msgpack length head: `small` (fix form, under `fix`) or the 8/16/32-bit codes */
static int put_head(Out *o, Py_ssize_t n, int fix, unsigned char small, int c8, unsigned char c16, unsigned char c32) {
    unsigned char h[5];
    Py_ssize_t k;
    if (n < fix) {
        h[0] = (unsigned char)(small | n);
        k = 1;
    } else if (c8 >= 0 && n < 256) {
        h[0] = (unsigned char)c8;
        h[1] = (unsigned char)n;
        k = 2;
    } else if (n < 65536) {
        h[0] = c16;
        h[1] = (unsigned char)(n >> 8);
        h[2] = (unsigned char)n;
        k = 3;
    } else {
        h[0] = c32;
        h[1] = (unsigned char)(n >> 24);
        h[2] = (unsigned char)(n >> 16);
        h[3] = (unsigned char)(n >> 8);
        h[4] = (unsigned char)n;
        k = 5;
    }
    return put_raw(o, h, k);
}

/* 1: written; 0: not a (str, bytes or None) pair (nothing else said); -1: an error set */
static int put_pair(Out *o, PyObject *pair, int as_array) {
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2)
        return 0;
    PyObject *k = PyTuple_GET_ITEM(pair, 0), *v = PyTuple_GET_ITEM(pair, 1);
    if (!PyUnicode_CheckExact(k) || (v != Py_None && !PyBytes_CheckExact(v)))
        return 0;
    Py_ssize_t kn;
    const char *ks = PyUnicode_AsUTF8AndSize(k, &kn);
    if (!ks) {
        PyErr_Clear(); /* (a lone surrogate: the twin says so) */
        return 0;
    }
    if (as_array && put_head(o, 2, 16, 0x90, -1, 0xdc, 0xdd) < 0)
        return -1;
    if (put_head(o, kn, 32, 0xa0, 0xd9, 0xda, 0xdb) < 0 || put_raw(o, ks, kn) < 0)
        return -1;
    if (v == Py_None) {
        unsigned char nil = 0xc0;
        return put_raw(o, &nil, 1) < 0 ? -1 : 1;
    }
    Py_ssize_t vn = PyBytes_GET_SIZE(v);
    if (put_head(o, vn, 0, 0, 0xc4, 0xc5, 0xc6) < 0 || put_raw(o, PyBytes_AS_STRING(v), vn) < 0)
        return -1;
    return 1;
}

/* whether the pairs' keys are unique and no value is None (the map form) */
static int map_form(PyObject *hs, Py_ssize_t nh) {
    for (Py_ssize_t i = 0; i < nh; i++) {
        PyObject *pair = PyTuple_GET_ITEM(hs, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || PyTuple_GET_ITEM(pair, 1) == Py_None)
            return 0;
    }
    if (nh < 2)
        return 1;
    PyObject *keys = PySet_New(NULL);
    if (!keys)
        return -1;
    for (Py_ssize_t i = 0; i < nh; i++)
        if (PySet_Add(keys, PyTuple_GET_ITEM(PyTuple_GET_ITEM(hs, i), 0)) < 0) {
            Py_DECREF(keys);
            PyErr_Clear(); /* (an unhashable key: not ours; the twin says so) */
            return 0;
        }
    int unique = PySet_GET_SIZE(keys) == nh;
    Py_DECREF(keys);
    return unique;
}

static PyObject *headers_column(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "headers_column(headers: list, most: int)");
        return NULL;
    }
    Py_ssize_t most = PyLong_AsSsize_t(args[1]);
    if (most == -1 && PyErr_Occurred())
        return NULL;
    PyObject *list = args[0];
    Py_ssize_t n = PyList_GET_SIZE(list);
    Out data = {NULL, 0, 0}, offs = {NULL, 0, 0};
    PyObject *result = NULL;
    int32_t at = 0;
    if (put_raw(&offs, &at, 4) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *hs = PyList_GET_ITEM(list, i);
        if (!PyTuple_Check(hs))
            goto fallback;
        Py_ssize_t nh = PyTuple_GET_SIZE(hs), before = data.len;
        if (nh) {
            int as_map = map_form(hs, nh);
            if (as_map < 0)
                goto done;
            if (as_map ? put_head(&data, nh, 16, 0x80, -1, 0xde, 0xdf) < 0 : put_head(&data, nh, 16, 0x90, -1, 0xdc, 0xdd) < 0)
                goto done;
            for (Py_ssize_t h = 0; h < nh; h++) {
                int rc = put_pair(&data, PyTuple_GET_ITEM(hs, h), !as_map);
                if (rc < 0)
                    goto done;
                if (rc == 0)
                    goto fallback;
            }
            if (data.len - before > most || data.len > INT32_MAX)
                goto fallback;
        }
        at = (int32_t)data.len;
        if (put_raw(&offs, &at, 4) < 0)
            goto done;
    }
    result = Py_BuildValue("(y#y#)", (const char *)(data.b ? (char *)data.b : ""), data.len,
                           (const char *)offs.b, offs.len);
    goto done;
fallback:
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(data.b);
    PyMem_Free(offs.b);
    return result;
}

/* ------------------------------------------------------------------ native headers, read */
/* a msgpack length of the kind whose codes are given (fix: its mask and its fix code's
 * range), at c->pos before end; -1: not one */
static Py_ssize_t get_len(Cursor *c, Py_ssize_t end, unsigned char fixlo, unsigned char fixhi, int c8, int c16,
                          int c32) {
    if (c->pos >= end)
        return -1;
    unsigned char t = c->b[c->pos];
    const unsigned char *p = c->b + c->pos + 1;
    if (t >= fixlo && t <= fixhi) {
        c->pos += 1;
        return t - fixlo;
    }
    if (c8 >= 0 && t == c8 && end - c->pos >= 2) {
        c->pos += 2;
        return p[0];
    }
    if (t == c16 && end - c->pos >= 3) {
        c->pos += 3;
        return (Py_ssize_t)p[0] << 8 | p[1];
    }
    if (t == c32 && end - c->pos >= 5) {
        c->pos += 5;
        return (Py_ssize_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
    }
    return -1;
}

/* a str at c->pos: a new str, or NULL with nothing set (not a good str) */
static PyObject *get_str(Cursor *c, Py_ssize_t end) {
    Py_ssize_t n = get_len(c, end, 0xa0, 0xbf, 0xd9, 0xda, 0xdb);
    if (n < 0 || n > end - c->pos)
        return NULL;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)c->b + c->pos, n, "strict");
    if (!s) {
        PyErr_Clear();
        return NULL;
    }
    c->pos += n;
    return s;
}

/* a value at c->pos as Kafka's: None, bytes (bin as is, str as its UTF-8); NULL with nothing
 * set for any other value */
static PyObject *get_value(Cursor *c, Py_ssize_t end) {
    if (c->pos >= end)
        return NULL;
    if (c->b[c->pos] == 0xc0) {
        c->pos++;
        Py_RETURN_NONE;
    }
    Py_ssize_t at = c->pos;
    Py_ssize_t n = get_len(c, end, 1, 0, 0xc4, 0xc5, 0xc6); /* (no fix form for bin) */
    if (n >= 0) {
        if (n > end - c->pos)
            return NULL;
        PyObject *b = PyBytes_FromStringAndSize((const char *)c->b + c->pos, n);
        c->pos += n;
        return b;
    }
    c->pos = at;
    PyObject *s = get_str(c, end);
    if (!s)
        return NULL;
    Py_ssize_t sn;
    const char *u = PyUnicode_AsUTF8AndSize(s, &sn);
    PyObject *b = u ? PyBytes_FromStringAndSize(u, sn) : NULL;
    Py_DECREF(s);
    if (!b)
        PyErr_Clear();
    return b;
}

static PyObject *kafka_headers(PyObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "kafka_headers(raw: bytes)");
        return NULL;
    }
    Py_ssize_t end = PyBytes_GET_SIZE(arg);
    Cursor c = {(const unsigned char *)PyBytes_AS_STRING(arg), 0};
    if (!end)
        return PyTuple_New(0);
    int as_map = 1;
    Py_ssize_t nh = get_len(&c, end, 0x80, 0x8f, -1, 0xde, 0xdf);
    if (nh < 0) {
        as_map = 0;
        nh = get_len(&c, end, 0x90, 0x9f, -1, 0xdc, 0xdd);
    }
    if (nh < 0 || nh > end - c.pos) /* (a pair takes 2 bytes at least: no tuple sized by a lie) */
        Py_RETURN_NONE;
    PyObject *out = PyTuple_New(nh), *keys = NULL;
    if (!out)
        return NULL;
    if (as_map && nh > 1 && !(keys = PySet_New(NULL)))
        goto fail;
    for (Py_ssize_t i = 0; i < nh; i++) {
        if (!as_map && get_len(&c, end, 0x90, 0x9f, -1, 0xdc, 0xdd) != 2)
            goto other;
        PyObject *k = get_str(&c, end);
        if (!k)
            goto other;
        if (keys && (PySet_Contains(keys, k) != 0 || PySet_Add(keys, k) < 0)) {
            Py_DECREF(k);
            PyErr_Clear();
            goto other; /* (a key twice in a map: msgpack's dict keeps one) */
        }
        PyObject *v = get_value(&c, end);
        if (!v) {
            Py_DECREF(k);
            goto other;
        }
        PyObject *pair = PyTuple_Pack(2, k, v);
        Py_DECREF(k);
        Py_DECREF(v);
        if (!pair)
            goto fail;
        PyTuple_SET_ITEM(out, i, pair);
    }
    if (c.pos != end)
        goto other;
    Py_XDECREF(keys);
    return out;
other:
    Py_XDECREF(keys);
    Py_DECREF(out);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(keys);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"kafka_headers", (PyCFunction)kafka_headers, METH_O,
     "kafka_headers(raw) -> a native record's headers as Kafka's pairs, or None (the Python twin's)"},
    {"headers_column", (PyCFunction)(void (*)(void))headers_column, METH_FASTCALL,
     "headers_column(headers, most) -> (data, int32 offsets) of native record headers, or None"},
    {"encode_records", (PyCFunction)(void (*)(void))encode_records, METH_FASTCALL,
     "encode_records(records, base_offset, base_ts) -> the records part of a batch"},
    {"decode_records", (PyCFunction)(void (*)(void))decode_records, METH_FASTCALL,
     "decode_records(buf, count, base_ts) -> (timestamps, offset deltas, keys, values, headers)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_records", "Kafka record batches' records in C", -1,
                                    methods};

PyMODINIT_FUNC PyInit__records(void) {
    if (!(s_offset = PyUnicode_InternFromString("offset")) || !(s_timestamp = PyUnicode_InternFromString("timestamp"))
        || !(s_key = PyUnicode_InternFromString("key")) || !(s_value = PyUnicode_InternFromString("value"))
        || !(s_headers = PyUnicode_InternFromString("headers")))
        return NULL;
    return PyModule_Create(&module);
}
