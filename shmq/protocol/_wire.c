/* The clients' plain calls' codec in C (issue 44, item 2): a plain request's frame packed from its
 * shape (``frame``, the twin of shapes.Shape.frame) and a CONSUME reply's messages read straight
 * into the client's deliveries (``leased``, the twin of the Delivery's construction from the decoded
 * payload), their fields in a C base (``Leased``) as the engine's deliveries have theirs.
 *
 * Strategy: sans-IO, like the rest of the package: bytes in, bytes or objects out, no socket. Each
 * call takes only the case it is sure of and answers None for anything else, which the Python codec
 * then handles as it always did: a value frame does not pack (a bool, a negative int, a subclass),
 * a reply it does not read whole (headers, a priority or a group, an older server's fields, bytes
 * that are not the shape). tests/test_protocol_wire.py holds each twin to its Python one: the same
 * bytes out, the same deliveries in.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>

#include "_wire.h"

/* ---- frame */

/* Pack ``v`` (bytes, an int >= 0, or a list of them) as msgpack-python packs it; 0 if it is
 * anything else (no exception), -1 on an exception. */
static int pack_value(MpOut *o, PyObject *v, int depth) {
    if (PyBytes_CheckExact(v)) return mp_w_bin(o, PyBytes_AS_STRING(v), (size_t)PyBytes_GET_SIZE(v)) ? 1 : -1;
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow > 0) {
            unsigned long long u = PyLong_AsUnsignedLongLong(v);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0; /* past 64 bits: msgpack-python raises, Python says so */
            }
            return mp_w_uint(o, u) ? 1 : -1;
        }
        if (overflow < 0 || x < 0) return 0;
        return mp_w_uint(o, (uint64_t)x) ? 1 : -1;
    }
    if (PyList_CheckExact(v) && !depth) {
        Py_ssize_t n = PyList_GET_SIZE(v);
        if (!mp_w_array(o, (uint64_t)n)) return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            int r = pack_value(o, PyList_GET_ITEM(v, i), 1);
            if (r <= 0) return r;
        }
        return 1;
    }
    return 0;
}

/* frame(prefix, msg_type, msg_id, value) -> bytes or None: the request frame of a shape whose fixed
 * fields packed to ``prefix`` (its varying field's key last) with ``value``; None: Python packs it */
static PyObject *wire_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "frame(prefix: bytes, msg_type, msg_id, value)");
        return NULL;
    }
    unsigned long type = PyLong_AsUnsignedLong(args[1]), msg_id = PyLong_AsUnsignedLong(args[2]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE; /* (Python's pack says what is out of range) */
    }
    if (type > 0xFF || msg_id > 0xFFFFFFFFul) Py_RETURN_NONE;
    Py_ssize_t plen = PyBytes_GET_SIZE(args[0]);
    PyObject *v = args[3];
    /* the size up front for the common values (a body, a tag, a wait), so one bytes object is made */
    size_t guess = WIRE_HEADER + (size_t)plen + 9 + (PyBytes_CheckExact(v) ? (size_t)PyBytes_GET_SIZE(v) : 0);
    MpOut o = {NULL, 0, 0};
    size_t at;
    if (!mp_room(&o, guess) || !wire_w_open(&o, &at)) {
        PyMem_Free(o.buf);
        return NULL;
    }
    mp_raw(&o, PyBytes_AS_STRING(args[0]), (size_t)plen);
    int r = pack_value(&o, v, 0);
    if (r <= 0 || o.len - WIRE_HEADER > 0xFFFFFFFFu) {
        PyMem_Free(o.buf);
        if (r < 0) return NULL;
        Py_RETURN_NONE;
    }
    wire_w_header(&o, at, (uint8_t)type, WIRE_OK, (uint32_t)msg_id);
    PyObject *out = PyBytes_FromStringAndSize((const char *)o.buf, (Py_ssize_t)o.len);
    PyMem_Free(o.buf);
    return out;
}

/* ---- Leased: a delivery's fields, as client/core.DeliveryCalls has them */
typedef struct {
    PyObject_HEAD
    PyObject *id, *body, *headers, *attempt, *priority, *enqueued_at, *group, *q, *tag, *sub, *settled, *raw, *conn;
} Leased;

static PyMemberDef leased_members[] = {
    {"id", T_OBJECT_EX, offsetof(Leased, id), 0, NULL},
    {"body", T_OBJECT_EX, offsetof(Leased, body), 0, NULL},
    {"attempt", T_OBJECT_EX, offsetof(Leased, attempt), 0, NULL},
    {"priority", T_OBJECT_EX, offsetof(Leased, priority), 0, NULL},
    {"enqueued_at", T_OBJECT_EX, offsetof(Leased, enqueued_at), 0, NULL},
    {"group", T_OBJECT_EX, offsetof(Leased, group), 0, NULL},
    {"_q", T_OBJECT_EX, offsetof(Leased, q), 0, NULL},
    {"_tag", T_OBJECT_EX, offsetof(Leased, tag), 0, NULL},
    {"_sub", T_OBJECT_EX, offsetof(Leased, sub), 0, NULL},
    {"_settled", T_OBJECT_EX, offsetof(Leased, settled), 0, NULL},
    {"_raw", T_OBJECT_EX, offsetof(Leased, raw), 0, NULL}, /* unset unless a serializer loaded the body */
    {"_conn", T_OBJECT_EX, offsetof(Leased, conn), 0, NULL},
    {NULL},
};

/* headers: {} until set (a map of its own per delivery, made when first read) */
static PyObject *leased_get_headers(Leased *d, void *closure) {
    if (!d->headers && !(d->headers = PyDict_New())) return NULL;
    Py_INCREF(d->headers);
    return d->headers;
}

static int leased_set_headers(Leased *d, PyObject *v, void *closure) {
    if (!v) {
        PyErr_SetString(PyExc_AttributeError, "headers cannot be deleted");
        return -1;
    }
    Py_INCREF(v);
    Py_XSETREF(d->headers, v);
    return 0;
}

static PyGetSetDef leased_getset[] = {
    {"headers", (getter)leased_get_headers, (setter)leased_set_headers, "the message's headers", NULL},
    {NULL},
};

static int leased_traverse(Leased *d, visitproc visit, void *arg) {
    Py_VISIT(d->id);
    Py_VISIT(d->body);
    Py_VISIT(d->headers);
    Py_VISIT(d->attempt);
    Py_VISIT(d->priority);
    Py_VISIT(d->enqueued_at);
    Py_VISIT(d->group);
    Py_VISIT(d->q);
    Py_VISIT(d->tag);
    Py_VISIT(d->sub);
    Py_VISIT(d->settled);
    Py_VISIT(d->raw);
    Py_VISIT(d->conn);
    return 0;
}

static int leased_clear(Leased *d) {
    Py_CLEAR(d->id);
    Py_CLEAR(d->body);
    Py_CLEAR(d->headers);
    Py_CLEAR(d->attempt);
    Py_CLEAR(d->priority);
    Py_CLEAR(d->enqueued_at);
    Py_CLEAR(d->group);
    Py_CLEAR(d->q);
    Py_CLEAR(d->tag);
    Py_CLEAR(d->sub);
    Py_CLEAR(d->settled);
    Py_CLEAR(d->raw);
    Py_CLEAR(d->conn);
    return 0;
}

static void leased_dealloc(Leased *d) {
    PyObject_GC_UnTrack(d);
    leased_clear(d);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyTypeObject LeasedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmq.protocol._wire.Leased",
    .tp_basicsize = sizeof(Leased),
    .tp_dealloc = (destructor)leased_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A leased message's fields as a CONSUME reply gives them; the client's delivery adds its calls",
    .tp_traverse = (traverseproc)leased_traverse,
    .tp_clear = (inquiry)leased_clear,
    .tp_members = leased_members,
    .tp_getset = leased_getset,
    .tp_new = PyType_GenericNew,
};

/* ---- leased: a CONSUME reply's messages as deliveries */

/* one message's fields, read from a row [id, tag, body, attempt, enqueued_at] or a map of exactly
 * id, delivery, body, headers {} (empty), attempt and enqueued_at (the plain message's, any order) */
typedef struct {
    uint64_t id, tag, attempt;
    const char *body;
    uint64_t bl;
    double at;
} Message;

static int read_double(MpIn *in, double *d) {
    if (!mp_need(in, 9) || *in->p != 0xCB) return 0;
    uint64_t v = mp_be(in->p + 1, 8);
    memcpy(d, &v, 8);
    in->p += 9;
    return 1;
}

static int read_message(MpIn *in, Message *m) {
    uint64_t n;
    if (mp_need(in, 1) && (*in->p & 0xF0) == 0x90) { /* a row */
        return mp_array(in, &n) && n == 5 && mp_uint(in, &m->id) && mp_uint(in, &m->tag) &&
               mp_bin(in, &m->body, &m->bl) && mp_uint(in, &m->attempt) && read_double(in, &m->at);
    }
    if (!mp_map(in, &n) || n != 6) return 0;
    int seen = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *k;
        uint64_t kn, h;
        int ok, bit;
        if (!mp_str(in, &k, &kn)) return 0;
        if (mp_is(k, kn, "id")) bit = 1, ok = mp_uint(in, &m->id);
        else if (mp_is(k, kn, "delivery")) bit = 2, ok = mp_uint(in, &m->tag);
        else if (mp_is(k, kn, "body")) bit = 4, ok = mp_bin(in, &m->body, &m->bl);
        else if (mp_is(k, kn, "headers")) bit = 8, ok = mp_map(in, &h) && !h; /* none */
        else if (mp_is(k, kn, "attempt")) bit = 16, ok = mp_uint(in, &m->attempt);
        else if (mp_is(k, kn, "enqueued_at")) bit = 32, ok = read_double(in, &m->at);
        else return 0;
        if (!ok || seen & bit) return 0;
        seen |= bit;
    }
    return seen == 63;
}

static PyObject *zero;

/* leased(payload, cls, q, conn) -> [delivery, ...] or None: a CONSUME reply's payload ({messages:
 * [...]}, msgpack) read into deliveries of ``cls`` (a subclass of Leased adding no fields) for handle
 * ``q`` on connection ``conn``, as DeliveryCalls(q, m) makes them; None if any message is not a plain
 * one, or the bytes are not that shape (Python's decoding then says what they are). */
static PyObject *wire_leased(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyType_Check(args[1]) || !PyType_IsSubtype((PyTypeObject *)args[1], &LeasedType)) {
        PyErr_SetString(PyExc_TypeError, "leased(payload, cls: a Leased subclass, q, conn)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[1];
    if (cls->tp_basicsize != LeasedType.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "leased: the class may add no fields (__slots__ = ())");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    MpIn in = {view.buf, (const uint8_t *)view.buf + view.len};
    uint64_t n, count;
    const char *k;
    uint64_t kn;
    PyObject *out = NULL;
    if (!mp_map(&in, &n) || n != 1 || !mp_str(&in, &k, &kn) || !mp_is(k, kn, "messages") || !mp_array(&in, &count) ||
        count > (uint64_t)view.len)
        goto none;
    out = PyList_New((Py_ssize_t)count);
    if (!out) goto fail;
    for (uint64_t i = 0; i < count; i++) {
        Message m;
        if (!read_message(&in, &m)) goto none;
        Leased *d = (Leased *)cls->tp_alloc(cls, 0);
        if (!d) goto fail;
        PyList_SET_ITEM(out, (Py_ssize_t)i, (PyObject *)d);
        d->id = PyLong_FromUnsignedLongLong(m.id);
        d->tag = PyLong_FromUnsignedLongLong(m.tag);
        d->body = PyBytes_FromStringAndSize(m.body, (Py_ssize_t)m.bl);
        d->attempt = PyLong_FromUnsignedLongLong(m.attempt);
        d->enqueued_at = PyFloat_FromDouble(m.at);
        if (!d->id || !d->tag || !d->body || !d->attempt || !d->enqueued_at) goto fail;
        Py_INCREF(zero);
        d->priority = zero;
        Py_INCREF(Py_None);
        d->group = Py_None;
        Py_INCREF(args[2]);
        d->q = args[2];
        Py_INCREF(args[3]);
        d->conn = args[3];
        Py_INCREF(Py_None);
        d->sub = Py_None;
        Py_INCREF(Py_False);
        d->settled = Py_False;
    }
    if (in.p != in.end) goto none;
    PyBuffer_Release(&view);
    return out;
none:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

/* tags(deliveries, cls, q, conn) -> [tag, ...] or None: the tags of a plain ack_many's deliveries, a
 * non-empty list of instances of exactly ``cls`` (a Leased subclass) of handle ``q`` leased on
 * connection ``conn``; None for anything else (the general ack_many says what is wrong). The twin of
 * PlainQueueCalls._plain_tags' C-level passes, in one. */
static PyObject *wire_tags(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "tags(deliveries, cls, q, conn)");
        return NULL;
    }
    PyObject *ds = args[0], *cls = args[1], *q = args[2], *conn = args[3];
    if (!PyList_CheckExact(ds) || !PyList_GET_SIZE(ds) || !PyType_Check(cls) ||
        !PyType_IsSubtype((PyTypeObject *)cls, &LeasedType))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(ds);
    for (Py_ssize_t i = 0; i < n; i++) {
        Leased *d = (Leased *)PyList_GET_ITEM(ds, i);
        if ((PyObject *)Py_TYPE(d) != cls || d->q != q || d->conn != conn || !d->tag) Py_RETURN_NONE;
    }
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *tag = ((Leased *)PyList_GET_ITEM(ds, i))->tag;
        Py_INCREF(tag);
        PyList_SET_ITEM(out, i, tag);
    }
    return out;
}

/* ---- replies: a client's read of reply frames */

/* replies(data, max_frame_bytes, waiting, unwaited, abandoned, raw, replies, unpackb, kwargs)
 *   -> (bytes used, [msg ids answered]): the twin of ClientCore.receive_data's loop for the frames
 *   it is sure of, from the start of ``data`` (nothing buffered before it): the reply to a request
 *   waited for (kept in ``replies`` as next_parts' tuple, its payload decoded by ``unpackb(payload,
 *   **kwargs)`` as _decode_payload decodes it, or its bytes for a msg id in ``raw``), and an OK reply
 *   to a request sent without waiting that is no put (dropped). It stops at anything else -- a push
 *   or an error for the connection (msg id 0), a reply nobody waits for, an error to defer, a reply
 *   to an abandoned request, a frame not whole, a header or payload the decoder would refuse -- and
 *   the Python loop goes on from there with the rest. */
static PyObject *wire_replies(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PySet_Check(args[2]) || !PyDict_Check(args[3]) || !PyDict_Check(args[4]) ||
        !PySet_Check(args[5]) || !PyDict_Check(args[6]) || !PyDict_Check(args[8])) {
        PyErr_SetString(PyExc_TypeError,
                        "replies(data, max_frame_bytes, waiting, unwaited, abandoned, raw, replies, unpackb, kwargs)");
        return NULL;
    }
    unsigned long long most = PyLong_AsUnsignedLongLong(args[1]);
    if (most == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    PyObject *waiting = args[2], *unwaited = args[3], *abandoned = args[4], *raw = args[5], *replies = args[6];
    PyObject *unpackb = args[7], *kwargs = args[8];
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *data = view.buf;
    size_t size = (size_t)view.len, pos = 0;
    PyObject *done = PyList_New(0), *result = NULL;
    if (!done) goto out;
    while (size - pos >= WIRE_HEADER) {
        WireHeader h;
        wire_header(data + pos, &h);
        if (h.magic != WIRE_MAGIC || h.version != WIRE_VERSION || h.length > most || size - pos - WIRE_HEADER < h.length)
            break;
        PyObject *id = PyLong_FromUnsignedLong(h.msg_id);
        if (!id) goto out;
        int waited = h.msg_id ? PySet_Contains(waiting, id) : 0;
        if (waited <= 0) { /* a push, an error for the connection, a reply nobody waits for: Python's */
            Py_DECREF(id);
            if (waited < 0) goto out;
            break;
        }
        PyObject *unwaited_type = PyDict_GetItemWithError(unwaited, id); /* borrowed */
        int kept_raw = 0;
        if (!unwaited_type && PyErr_Occurred()) {
            Py_DECREF(id);
            goto out;
        }
        if (unwaited_type) { /* posted: an OK reply is dropped, unless it answers gathered puts */
            long t = PyLong_Check(unwaited_type) ? PyLong_AsLong(unwaited_type) : 0;
            if (h.status != WIRE_OK || t == MSG_PRODUCE || t == MSG_PRODUCE_BATCH) {
                PyErr_Clear();
                Py_DECREF(id);
                break;
            }
        } else if (PyDict_GET_SIZE(abandoned)) {
            int a = PyDict_Contains(abandoned, id);
            if (a) {
                Py_DECREF(id);
                if (a < 0) goto out;
                break;
            }
        }
        if (!unwaited_type && h.status == WIRE_OK && PySet_GET_SIZE(raw)) {
            kept_raw = PySet_Contains(raw, id);
            if (kept_raw < 0) {
                Py_DECREF(id);
                goto out;
            }
        }
        PyObject *payload;
        const char *p = (const char *)data + pos + WIRE_HEADER;
        if (kept_raw) {
            payload = PyBytes_FromStringAndSize(p, h.length);
        } else if (!h.length) {
            payload = PyDict_New();
        } else { /* as _decode_payload: a map with str keys, else the Python decoder says what it is */
            PyObject *b = PyBytes_FromStringAndSize(p, h.length), *a = b ? PyTuple_Pack(1, b) : NULL;
            Py_XDECREF(b);
            payload = a ? PyObject_Call(unpackb, a, kwargs) : NULL;
            Py_XDECREF(a);
            int good = payload && PyDict_CheckExact(payload);
            if (good) {
                Py_ssize_t i = 0;
                PyObject *k, *v;
                while (good && PyDict_Next(payload, &i, &k, &v)) good = PyUnicode_CheckExact(k);
            }
            if (!good) {
                PyErr_Clear();
                Py_XDECREF(payload);
                Py_DECREF(id);
                break;
            }
        }
        if (!payload) {
            Py_DECREF(id);
            goto out;
        }
        int bad = PySet_Discard(waiting, id) < 0 || (PySet_GET_SIZE(raw) && PySet_Discard(raw, id) < 0);
        if (!bad && unwaited_type) {
            bad = PyDict_DelItem(unwaited, id) < 0; /* (its OK reply: dropped) */
        } else if (!bad) {
            PyObject *parts = Py_BuildValue("(BOOHB)", h.type, id, payload, h.status, h.version);
            bad = !parts || PyDict_SetItem(replies, id, parts) < 0 || PyList_Append(done, id) < 0;
            Py_XDECREF(parts);
        }
        Py_DECREF(payload);
        Py_DECREF(id);
        if (bad) goto out;
        pos += WIRE_HEADER + h.length;
    }
    result = Py_BuildValue("(nO)", (Py_ssize_t)pos, done);
out:
    Py_XDECREF(done);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"frame", (PyCFunction)(void (*)(void))wire_frame, METH_FASTCALL,
     "frame(prefix, msg_type, msg_id, value) -> bytes or None: a plain request's frame from its shape's prefix"},
    {"replies", (PyCFunction)(void (*)(void))wire_replies, METH_FASTCALL,
     "replies(data, max_frame_bytes, waiting, unwaited, abandoned, raw, replies, unpackb, kwargs) -> (bytes used, "
     "msg ids answered): the reply frames at the start of a client's read, taken in"},
    {"tags", (PyCFunction)(void (*)(void))wire_tags, METH_FASTCALL,
     "tags(deliveries, cls, q, conn) -> [tag, ...] or None: a plain ack_many's tags"},
    {"leased", (PyCFunction)(void (*)(void))wire_leased, METH_FASTCALL,
     "leased(payload, cls, q, conn) -> [delivery, ...] or None: a CONSUME reply's plain messages as deliveries"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "shmq.protocol._wire",
                                    "The clients' plain calls' codec in C (issue 44).", -1, methods};

PyMODINIT_FUNC PyInit__wire(void) {
    if (PyType_Ready(&LeasedType) < 0) return NULL;
    zero = PyLong_FromLong(0);
    if (!zero) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&LeasedType);
    if (PyModule_AddObject(m, "Leased", (PyObject *)&LeasedType) < 0) {
        Py_DECREF(&LeasedType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
