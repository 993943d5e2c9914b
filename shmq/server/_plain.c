/* The server's plain requests in C (issue 44): a read's PRODUCE, PRODUCE_BATCH, CONSUME and ACK
 * frames of the plain shapes, parsed, checked, served through the engine's C paths and answered,
 * in one call from the event loop per read (``Plain.read``: the fast path of ``Connection.take``,
 * the one way in for a read; ``Plain.serve`` for frames that came in more than one read).
 *
 * Strategy: the twin of connection.py's dispatch to handlers/queues.py's plain_produce, produce_batch,
 * consume / plain_consume and plain_ack, for the shapes the clients send every message, as the
 * engine's _fast.c is the twin of its Python hot paths. It only ever serves the case it is sure
 * of: a frame it does not take whole -- another type or shape, a field it does not know, a
 * bad value, an unknown queue, a tag it does not hold, a full queue, a busy lock, anything
 * the engine hands back (R_*) -- ends the call there, nothing of that frame done, and the
 * connection hands it and the rest of the read to the Python codec and handlers, which serve
 * every case and say what is wrong. So the wire, its errors and the leases are the Python
 * path's, byte for byte (tests/test_server_plain.py holds the two equal on random and mutated
 * frames). Its state is one owner's: the leases stay in the connection's Leases (tag ->
 * (handle, Delivery)), handles in the server's AttachedHandles; this keeps only a cache of what
 * each handle's C calls take. The codec is protocol/_wire.h; the engine's calls come through
 * its capsule (engine/_fast_api.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../engine/_fast_api.h"
#include "../protocol/_wire.h" /* (and the request types, MSG_*: frames.py's, generated in _frames.h) */
#include "_reply_budget.h"      /* RECORD_OVERHEAD, REPLY_RESERVE: answers.py's, generated */

/* the request types it serves, one range (the frame loop takes MSG_PRODUCE .. MSG_ACK) */
_Static_assert(MSG_PRODUCE_BATCH == MSG_PRODUCE + 1 && MSG_CONSUME == MSG_PRODUCE + 2 && MSG_ACK == MSG_PRODUCE + 3,
               "the plain request types are consecutive");

#define N_TARGETS 16         /* queues whose C arguments are kept, per server */
#define ON_STACK 64          /* batch items handled without an allocation */

static ShmqFastAPI *api;

/* names looked up, made once */
static PyObject *s_held, *s_pushed;
/* the Connection's attributes a read served whole reads and sets (connection.py) */
static PyObject *s_closing, *s_reserved, *s_decoder, *s_buffered, *s_bounds, *s_got, *s_write_paused, *s_leases,
    *s_max_frame_bytes, *s_wait_plain, *s_requests, *s_served_bytes, *s_clocks, *s_frame_started, *s_last_active,
    *s_eof_sent, *s_transport, *s_is_closing, *s_write, *s_reading, *s_budget_wait, *s_account, *s_peers, *s_lines,
    *s_live;

#define NO_SLOT UINT64_MAX /* a handle's process slot before its first take (Queue._slot -1) */

/* One queue handle's C arguments, as its Python paths pass them. */
typedef struct {
    PyObject *name; /* str (NULL: a free slot) */
    PyObject *q;    /* the handle (strong): a request serves it while the server's handles hold it */
    char *seg;
    uint64_t base, cap, slot, vis_ns, maxdel, maxmsg, step;
    int ok;            /* a single-ring handle on C paths: the fields below are its (slot: once it has one) */
    int logged, plain; /* plain: and no general take (priorities, TTLs): the plain takes serve it */
} Target;

typedef struct {
    PyObject_HEAD
    PyObject *handles;     /* name -> handle (the server's AttachedHandles.handles) */
    PyObject *attach;      /* name -> handle, attached if needed (AttachedHandles.get); raises if none */
    PyObject *tags;        /* the leases' tag counter (leases._tags) */
    PyObject *consumed;    /* (leases, msg_id, q, deliveries, rows) -> the reply frame, Python's */
    PyObject *error_frame; /* (msg_type, msg_id, exception) -> the error reply (connection.error_frame) */
    PyObject *kept_alive;  /* deliveries kept alive in this process (keepalive.live()): acks left to Python */
    /* the engine's calls for the machinery (engine/maintenance.py) */
    PyObject *c_arguments, *wal_descriptor, *wake_consumers, *wake_producers, *repair_lock, *expired_error;
    PyObject *count;       /* metrics: (msg type, seconds, status) per request, or None */
    uint64_t max_frame_bytes;
    Target targets[N_TARGETS];
    int next_slot;
    int serving; /* in serve: ``deliver`` leaves its waiter to Python (one reply buffer) */
    MpOut out;
    /* a read served whole here (``read``, ``buffer``; set by ``reads``): the receive buffer every
     * connection reads into, its first SMALL_FRAME_BYTES as the view a connection holding nothing
     * reads into, the server's AttachedHandles.notify, its loop's busy poll ``touch`` and its clock */
    Py_buffer rbuf;
    PyObject *rsmall, *notify, *touch, *time;
    PyObject *queues; /* the server's AttachedHandles of queues: whose lines have waiters (``awaited``) */
} Plain;

static inline uint64_t clock_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---- handles' C arguments */
static void target_clear(Target *t) {
    Py_CLEAR(t->name);
    Py_CLEAR(t->q);
}

/* ``t``'s C arguments from the engine (maintenance.c_arguments): 1, or 0 where its handle
 * does not run the C paths on one ring (an exception cleared). */
static int target_describe(Plain *self, Target *t) {
    t->ok = t->plain = 0;
    PyObject *a = PyObject_CallOneArg(self->c_arguments, t->q);
    if (!a || !PyTuple_Check(a) || PyTuple_GET_SIZE(a) != 10) {
        Py_XDECREF(a);
        PyErr_Clear();
        return 0;
    }
    uint64_t v[8];
    for (int i = 0; i < 8; i++) {
        PyObject *x = PyTuple_GET_ITEM(a, i);
        if (i == 3 && PyLong_Check(x) && PyLong_AsLong(x) < 0) { /* no process slot yet */
            v[i] = NO_SLOT;
            continue;
        }
        v[i] = PyLong_Check(x) ? PyLong_AsUnsignedLongLong(x) : (uint64_t)-1;
        if (PyErr_Occurred()) {
            Py_DECREF(a);
            PyErr_Clear();
            return 0;
        }
    }
    int logged = PyObject_IsTrue(PyTuple_GET_ITEM(a, 8)), general = PyObject_IsTrue(PyTuple_GET_ITEM(a, 9));
    Py_DECREF(a);
    if (logged < 0 || general < 0 || !v[0] || !v[2]) {
        PyErr_Clear();
        return 0;
    }
    t->seg = (char *)(uintptr_t)v[0];
    t->base = v[1];
    t->cap = v[2];
    t->slot = v[3];
    t->vis_ns = v[4];
    t->maxdel = v[5];
    t->maxmsg = v[6];
    t->step = v[7];
    t->logged = logged;
    t->plain = !general;
    t->ok = 1;
    return 1;
}

static void target_fill(Plain *self, Target *t, PyObject *name, PyObject *q) {
    target_clear(t);
    Py_INCREF(name);
    Py_INCREF(q);
    t->name = name;
    t->q = q;
    target_describe(self, t);
}

/* The handle the server holds for the queue named by ``s`` (``n`` bytes of UTF-8), its C
 * arguments kept; NULL (no exception) when Python must serve the request: no such queue, a
 * name that is not UTF-8, a handle deleted or replaced. */
static Target *target_of(Plain *self, const char *s, uint64_t n) {
    for (int i = 0; i < N_TARGETS; i++) {
        Target *t = &self->targets[i];
        if (!t->name) continue;
        Py_ssize_t len;
        const char *have = PyUnicode_AsUTF8AndSize(t->name, &len);
        if ((uint64_t)len == n && !memcmp(have, s, n)) {
            PyObject *held = PyDict_GetItemWithError(self->handles, t->name); /* borrowed */
            if (held == t->q) return t;
            if (PyErr_Occurred()) PyErr_Clear();
            break; /* replaced (a delete and create) or forgotten: attach again below */
        }
    }
    PyObject *name = PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "strict");
    if (!name) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *q = PyObject_CallOneArg(self->attach, name);
    if (!q) {
        PyErr_Clear(); /* (no such queue: Python says so) */
        Py_DECREF(name);
        return NULL;
    }
    Target *t = NULL;
    for (int i = 0; i < N_TARGETS; i++) /* its old slot, if it had one */
        if (self->targets[i].name && PyUnicode_Compare(self->targets[i].name, name) == 0) t = &self->targets[i];
    if (!t) {
        t = &self->targets[self->next_slot];
        self->next_slot = (self->next_slot + 1) % N_TARGETS;
    }
    target_fill(self, t, name, q);
    Py_DECREF(name);
    Py_DECREF(q);
    return t;
}

/* Whether the handle has its process slot now (a take or an ack's): registered by its first
 * Python take, the same for its life. */
static int has_slot(Plain *self, Target *t) {
    return t->slot != NO_SLOT || (target_describe(self, t) && t->slot != NO_SLOT);
}

/* The engine's call ``fn`` for the handle (and an argument), its result dropped: 0, or -1. */
static int call_engine(PyObject *fn, Target *t, PyObject *arg) {
    PyObject *r = arg ? PyObject_CallFunctionObjArgs(fn, t->q, arg, NULL) : PyObject_CallOneArg(fn, t->q);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

/* The posts a C put owed sleeping consumers (``n``). */
static int wake_consumers(Plain *self, Target *t, uint64_t n) {
    if (!n) return 0;
    PyObject *k = PyLong_FromUnsignedLongLong(n);
    if (!k) return -1;
    int r = call_engine(self->wake_consumers, t, k);
    Py_DECREF(k);
    return r;
}

/* After R_OWNERDEAD (the lock held, its holder dead): the handle repairs and unlocks. */
static int repaired(Plain *self, Target *t) { return call_engine(self->repair_lock, t, NULL); }

/* The log descriptor (fd, gen) of a logged handle, as its put reads it; 0 when it has none now. */
static int wal_of(Plain *self, Target *t, long *fd, uint64_t *gen) {
    PyObject *pair = PyObject_CallOneArg(self->wal_descriptor, t->q);
    if (!pair) {
        PyErr_Clear();
        return 0;
    }
    int ok = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2;
    if (ok) {
        *gen = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pair, 0));
        *fd = PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
        ok = !PyErr_Occurred();
        PyErr_Clear();
    }
    Py_DECREF(pair);
    return ok;
}

/* ---- replies */
static int reply_open(Plain *self, size_t *at) { return wire_w_open(&self->out, at); }

static void reply_close(Plain *self, size_t at, uint8_t type, uint32_t msg_id) {
    wire_w_header(&self->out, at, (uint8_t)(type | WIRE_REPLY_BIT), WIRE_OK, msg_id);
}

/* The reply buffer emptied after a call (a big reply's is not kept). */
static void reply_reset(Plain *self) {
    if (self->out.cap > (1u << 20)) {
        PyMem_Free(self->out.buf);
        self->out.buf = NULL;
        self->out.cap = 0;
    }
    self->out.len = 0;
}

/* {key: v}, the reply of a PRODUCE ("id") or an ACK ("acked") */
static int reply_one(Plain *self, uint8_t type, uint32_t msg_id, const char *key, uint64_t v) {
    size_t at;
    if (!reply_open(self, &at) || !mp_w_map(&self->out, 1) || !mp_w_key(&self->out, key) ||
        !mp_w_uint(&self->out, v))
        return -1;
    reply_close(self, at, type, msg_id);
    return 0;
}

/* Python's bytes for a reply it made (the general lease path, an error reply) */
static int reply_bytes(Plain *self, PyObject *b) {
    if (!b) return -1;
    if (!PyBytes_Check(b)) {
        Py_DECREF(b);
        PyErr_SetString(PyExc_TypeError, "a reply frame must be bytes");
        return -1;
    }
    size_t n = (size_t)PyBytes_GET_SIZE(b);
    int ok = mp_room(&self->out, n);
    if (ok) mp_raw(&self->out, PyBytes_AS_STRING(b), n);
    Py_DECREF(b);
    return ok ? 0 : -1;
}

/* ---- the requests: each returns 1 (served, its reply written), 0 (Python serves it and the
 * rest; nothing of it done) or -1 (an exception: the connection closes, as after a bug) */

/* PRODUCE {queue: str, body: bin} */
static int produce(Plain *self, MpIn *in, uint32_t msg_id, PyObject *touched) {
    uint64_t n, qn = 0, bl = 0, kn;
    const char *qs = NULL, *body = NULL, *k;
    if (!mp_map(in, &n) || n != 2) return 0;
    for (int i = 0; i < 2; i++) {
        if (!mp_str(in, &k, &kn)) return 0;
        if (mp_is(k, kn, "queue") && !qs) {
            if (!mp_str(in, &qs, &qn)) return 0;
        } else if (mp_is(k, kn, "body") && !body) {
            if (!mp_bin(in, &body, &bl)) return 0;
        } else {
            return 0;
        }
    }
    if (in->p != in->end) return 0;
    Target *t = target_of(self, qs, qn);
    if (!t || !t->ok || bl > t->maxmsg) return 0;
    long fd = -1;
    uint64_t gen = 0;
    if (t->logged && !wal_of(self, t, &fd, &gen)) return 0;
    int was = api->serve_own(1); /* (this loop serves its own waiters: touched) */
    int64_t r = api->put(t->seg, t->base, t->cap, body, bl, "", 0, clock_ns(CLOCK_REALTIME), fd, gen);
    api->serve_own(was);
    if (r < 0) {
        if (r == api->r_ownerdead && repaired(self, t) < 0) return -1;
        return 0;
    }
    if ((r & 1) && wake_consumers(self, t, 1) < 0) return -1;
    if (PyList_Append(touched, t->name) < 0) return -1;
    return reply_one(self, MSG_PRODUCE, msg_id, "id", (uint64_t)r >> 1) < 0 ? -1 : 1;
}

/* PRODUCE_BATCH {queue: str, messages: [bin, ...] or [{body: bin}, ...], each?: bool} */
static int produce_batch(Plain *self, MpIn *in, uint32_t msg_id, PyObject *touched) {
    uint64_t n, qn = 0, kn, count = 0;
    const char *qs = NULL, *k;
    const uint8_t *msgs = NULL;
    int each, seen_each = 0;
    if (!mp_map(in, &n) || n < 2 || n > 3) return 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!mp_str(in, &k, &kn)) return 0;
        if (mp_is(k, kn, "queue") && !qs) {
            if (!mp_str(in, &qs, &qn)) return 0;
        } else if (mp_is(k, kn, "messages") && !msgs) {
            if (!mp_array(in, &count) || !count) return 0;
            msgs = in->p;
            const char *s;
            uint64_t sl; /* skipped now, read below */
            int maps = in->p < in->end && (*in->p & 0xF0) == 0x80; /* every item a map {body}, or a bin */
            for (uint64_t j = 0; j < count; j++) {
                if (maps) {
                    uint64_t m;
                    if (!mp_map(in, &m) || m != 1 || !mp_str(in, &s, &sl) || !mp_is(s, sl, "body")) return 0;
                }
                if (!mp_bin(in, &s, &sl)) return 0;
            }
        } else if (mp_is(k, kn, "each") && !seen_each) {
            if (!mp_bool(in, &each)) return 0;
            seen_each = 1;
        } else {
            return 0;
        }
    }
    if (!qs || !msgs || in->p != in->end) return 0;
    Target *t = target_of(self, qs, qn);
    if (!t || !t->ok || t->logged) return 0; /* (a logged queue's batch: the Python append logs it) */
    const char *bs[ON_STACK];
    uint64_t ls[ON_STACK];
    const char **bodies = bs;
    uint64_t *lens = ls;
    void *heap = NULL;
    if (count > ON_STACK) {
        heap = PyMem_Malloc((size_t)count * (sizeof(char *) + sizeof(uint64_t)));
        if (!heap) {
            PyErr_NoMemory();
            return -1;
        }
        bodies = (const char **)heap;
        lens = (uint64_t *)(bodies + count);
    }
    MpIn m = {msgs, in->end};
    for (uint64_t j = 0; j < count; j++) {
        const char *s;
        uint64_t sl, one;
        if ((*m.p & 0xF0) == 0x80) {
            mp_map(&m, &one);
            mp_str(&m, &s, &sl);
        }
        mp_bin(&m, &bodies[j], &lens[j]);
    }
    uint64_t first, posts;
    int was = api->serve_own(1);
    int r = api->put_many(t->seg, t->base, t->cap, (Py_ssize_t)count, bodies, lens, t->maxmsg,
                          clock_ns(CLOCK_REALTIME), &first, &posts);
    api->serve_own(was);
    PyMem_Free(heap);
    if (r) {
        if (r == api->r_ownerdead && repaired(self, t) < 0) return -1;
        return 0; /* (full, too large: Python raises, or puts each with ``each``) */
    }
    if (wake_consumers(self, t, posts) < 0 || PyList_Append(touched, t->name) < 0) return -1;
    size_t at;
    MpOut *o = &self->out;
    if (!reply_open(self, &at) || !mp_w_map(o, 1) || !mp_w_key(o, "ids") || !mp_w_array(o, count)) return -1;
    for (uint64_t j = 0; j < count; j++)
        if (!mp_w_uint(o, first + j * t->step)) return -1;
    reply_close(self, at, MSG_PRODUCE_BATCH, msg_id);
    return 1;
}

static uint64_t field_u64(PyObject *x) { return x ? PyLong_AsUnsignedLongLong(x) : 0; }

/* One leased delivery in a CONSUME reply: a row [id, tag, body, attempt, enqueued_at], or the
 * map delivery_fields makes ({id, delivery, body, headers: {}, attempt, enqueued_at}). */
static int write_delivery(MpOut *o, ShmqDeliveryFields *d, uint64_t tag, int rows) {
    uint64_t id = field_u64(d->id), attempt = field_u64(d->attempt), enq = field_u64(d->enq);
    if (PyErr_Occurred()) return 0;
    double at = (double)enq / 1e9;
    const char *body = PyBytes_AS_STRING(d->body);
    size_t bl = (size_t)PyBytes_GET_SIZE(d->body);
    if (rows)
        return mp_w_array(o, 5) && mp_w_uint(o, id) && mp_w_uint(o, tag) && mp_w_bin(o, body, bl) &&
               mp_w_uint(o, attempt) && mp_w_double(o, at);
    return mp_w_map(o, 6) && mp_w_key(o, "id") && mp_w_uint(o, id) && mp_w_key(o, "delivery") &&
           mp_w_uint(o, tag) && mp_w_key(o, "body") && mp_w_bin(o, body, bl) && mp_w_key(o, "headers") &&
           mp_w_map(o, 0) && mp_w_key(o, "attempt") && mp_w_uint(o, attempt) && mp_w_key(o, "enqueued_at") &&
           mp_w_double(o, at);
}

/* What is ready of ``t``'s queue now, up to ``most``, leased to the connection of ``leases`` and
 * answered in ``self->out`` as the CONSUME reply ``msg_id`` (rows or maps): 1 (served), 0 (Python's:
 * nothing done) or -1 (an exception). Nothing ready: 0 with ``*empty`` set, nothing written. */
static int take_reply(Plain *self, Target *t, uint32_t msg_id, PyObject *leases, uint64_t most, int rows,
                      int *empty) {
    *empty = 0;
    uint64_t room = self->max_frame_bytes - REPLY_RESERVE, need = most * RECORD_OVERHEAD;
    uint64_t budget = self->max_frame_bytes < REPLY_RESERVE || need >= room ? 0 : room - need;
    if (!budget) return 0; /* (_reply_budget's 0: Python's take says what it takes) */
    PyObject *got = api->take_many(t->q, t->seg, t->base, t->cap, t->slot, t->vis_ns, t->maxdel,
                                   clock_ns(CLOCK_MONOTONIC), most, budget);
    if (!got) return -1;
    if (PyLong_Check(got)) {
        long r = PyLong_AsLong(got);
        Py_DECREF(got);
        if (r == api->r_empty) {
            *empty = 1;
            return 0;
        }
        if (r == api->r_ownerdead && repaired(self, t) < 0) return -1;
        return 0;
    }
    /* leased now: the connection holds them (tag -> (handle, delivery)), whatever comes next */
    Py_ssize_t count = PyList_GET_SIZE(got);
    int plain = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        ShmqDeliveryFields *d = (ShmqDeliveryFields *)PyList_GET_ITEM(got, i);
        if (d->hraw != Py_None || !d->body || !PyBytes_CheckExact(d->body)) plain = 0;
    }
    if (!plain) { /* headers: Python's lease and reply (delivery_fields / delivery_row) */
        PyObject *r = PyObject_CallFunction(self->consumed, "OIOOi", leases, msg_id, t->q, got, rows);
        Py_DECREF(got);
        return reply_bytes(self, r) < 0 ? -1 : 1;
    }
    PyObject *held = PyObject_GetAttr(leases, s_held);
    if (!held) {
        Py_DECREF(got);
        return -1;
    }
    MpOut *o = &self->out;
    size_t at;
    int ok = reply_open(self, &at) && mp_w_map(o, 1) && mp_w_key(o, "messages") && mp_w_array(o, (uint64_t)count);
    for (Py_ssize_t i = 0; ok && i < count; i++) {
        PyObject *d = PyList_GET_ITEM(got, i);
        PyObject *tag = PyIter_Next(self->tags);
        PyObject *pair = tag ? PyTuple_Pack(2, t->q, d) : NULL;
        ok = pair && PyDict_SetItem(held, tag, pair) == 0;
        Py_XDECREF(pair);
        if (ok) ok = write_delivery(o, (ShmqDeliveryFields *)d, PyLong_AsUnsignedLongLong(tag), rows);
        Py_XDECREF(tag);
    }
    Py_DECREF(held);
    Py_DECREF(got);
    if (!ok) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "a CONSUME reply could not be made");
        return -1;
    }
    reply_close(self, at, MSG_CONSUME, msg_id);
    return 1;
}

/* CONSUME {queue: str, max: int >= 1, wait_ms: int >= 0, rows?: bool}: what is ready now, leased
 * to the connection; nothing ready and a wait asked for: lined up by the connection's ``wait``
 * (Connection.wait_plain; no reply yet), or Python's where that says no or there is none. A
 * queue an earlier frame of the call put to is Python's: the gets waiting on it are answered
 * first (Connection.served), as Python's PRODUCE answers them before the next frame. */
static int consume(Plain *self, MpIn *in, uint32_t msg_id, PyObject *leases, PyObject *wait, PyObject *touched) {
    uint64_t n, qn = 0, kn, most = 0, wait_ms = 0;
    const char *qs = NULL, *k;
    int rows = 0, seen_max = 0, seen_wait = 0, seen_rows = 0;
    if (!mp_map(in, &n) || n < 3 || n > 4) return 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!mp_str(in, &k, &kn)) return 0;
        if (mp_is(k, kn, "queue") && !qs) {
            if (!mp_str(in, &qs, &qn)) return 0;
        } else if (mp_is(k, kn, "max") && !seen_max) {
            if (!mp_uint(in, &most) || !most || most > (1u << 24)) return 0; /* (a reply can hold no more) */
            seen_max = 1;
        } else if (mp_is(k, kn, "wait_ms") && !seen_wait) {
            if (!mp_uint(in, &wait_ms)) return 0;
            seen_wait = 1;
        } else if (mp_is(k, kn, "rows") && !seen_rows) {
            if (!mp_bool(in, &rows)) return 0;
            seen_rows = 1;
        } else {
            return 0;
        }
    }
    if (!qs || !seen_max || !seen_wait || in->p != in->end) return 0;
    /* a queue this call put to: Python's, once its waiters were answered (as a PRODUCE in Python answers them) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(touched); i++) {
        Py_ssize_t len;
        const char *name = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(touched, i), &len);
        if (!name) return -1;
        if ((uint64_t)len == qn && !memcmp(name, qs, qn)) return 0;
    }
    Target *t = target_of(self, qs, qn);
    if (!t || !t->ok || !t->plain || !has_slot(self, t)) return 0;
    int empty;
    int r = take_reply(self, t, msg_id, leases, most, rows, &empty);
    if (r || !empty) return r;
    if (wait_ms) {
        if (wait == Py_None) return 0;
        PyObject *w = PyObject_CallFunction(wait, "IOKiK", msg_id, t->q, (unsigned long long)most, rows,
                                            (unsigned long long)wait_ms);
        if (!w) return -1;
        int lined = PyObject_IsTrue(w);
        Py_DECREF(w);
        return lined;
    }
    size_t at; /* nothing, and no wait asked for */
    if (!reply_open(self, &at) || !mp_w_map(&self->out, 1) || !mp_w_key(&self->out, "messages") ||
        !mp_w_array(&self->out, 0))
        return -1;
    reply_close(self, at, MSG_CONSUME, msg_id);
    return 1;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* ACK {queue: str, deliveries: [int, ...]}: every tag held by the connection, of this queue,
 * named once, none pushed to a subscription (else Python); settled, then held no more. */
static int ack(Plain *self, MpIn *in, uint32_t msg_id, PyObject *leases) {
    uint64_t n, qn = 0, kn, k = 0;
    const char *qs = NULL, *key;
    const uint8_t *list = NULL;
    if (!mp_map(in, &n) || n != 2) return 0;
    for (int i = 0; i < 2; i++) {
        if (!mp_str(in, &key, &kn)) return 0;
        if (mp_is(key, kn, "queue") && !qs) {
            if (!mp_str(in, &qs, &qn)) return 0;
        } else if (mp_is(key, kn, "deliveries") && !list) {
            if (!mp_array(in, &k)) return 0;
            list = in->p;
            uint64_t v;
            for (uint64_t j = 0; j < k; j++)
                if (!mp_uint(in, &v)) return 0;
        } else {
            return 0;
        }
    }
    if (!qs || !list || in->p != in->end || !k) return 0;
    if (PyDict_GET_SIZE(self->kept_alive)) return 0;
    Target *t = target_of(self, qs, qn);
    if (!t || !t->ok || (t->logged && k > 1) || !has_slot(self, t)) return 0; /* (a logged batch: Python logs it) */
    if (!t->plain) return 0; /* (a prefetch cap: the general settle drops what it holds) */
    PyObject *held = PyObject_GetAttr(leases, s_held), *pushed = PyObject_GetAttr(leases, s_pushed);
    uint64_t ts_stack[ON_STACK], tr_stack[3 * ON_STACK];
    Py_ssize_t bad_stack[ON_STACK];
    uint64_t *tags = ts_stack, *triples = tr_stack;
    Py_ssize_t *bad = bad_stack;
    void *heap = NULL;
    PyObject **ds = NULL, *keys = NULL;
    int result = -1;
    if (!held || !pushed || !PyDict_Check(held) || !PyDict_Check(pushed)) goto done;
    if (k > ON_STACK) {
        heap = PyMem_Malloc((size_t)k * (5 * sizeof(uint64_t) + sizeof(Py_ssize_t)));
        if (!heap) {
            PyErr_NoMemory();
            goto done;
        }
        tags = (uint64_t *)heap;
        triples = tags + k;
        bad = (Py_ssize_t *)(triples + 3 * k);
    }
    MpIn m = {list, in->end};
    for (uint64_t j = 0; j < k; j++) mp_uint(&m, &tags[j]);
    if (k > 1) { /* a tag named twice: Python counts it once */
        uint64_t *sorted = triples; /* (scratch, before the triples are written) */
        memcpy(sorted, tags, (size_t)k * sizeof(uint64_t));
        qsort(sorted, (size_t)k, sizeof(uint64_t), cmp_u64);
        for (uint64_t j = 1; j < k; j++)
            if (sorted[j] == sorted[j - 1]) {
                result = 0;
                goto done;
            }
    }
    keys = PyList_New((Py_ssize_t)k); /* the tags as the dict's keys, and the deliveries they name */
    ds = PyMem_Malloc((size_t)k * sizeof(PyObject *));
    if (!keys || !ds) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    int pushes = PyDict_GET_SIZE(pushed) > 0;
    for (uint64_t j = 0; j < k; j++) {
        PyObject *tag = PyLong_FromUnsignedLongLong(tags[j]);
        if (!tag) goto done;
        PyList_SET_ITEM(keys, (Py_ssize_t)j, tag);
        PyObject *pair = PyDict_GetItemWithError(held, tag); /* borrowed */
        if (!pair) {
            if (PyErr_Occurred()) goto done;
            result = 0; /* not held here: Python names it */
            goto done;
        }
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || PyTuple_GET_ITEM(pair, 0) != t->q) {
            result = 0;
            goto done;
        }
        if (pushes) {
            int in_sub = PyDict_Contains(pushed, tag);
            if (in_sub) {
                result = in_sub < 0 ? -1 : 0;
                goto done;
            }
        }
        ShmqDeliveryFields *d = (ShmqDeliveryFields *)PyTuple_GET_ITEM(pair, 1);
        if (!PyObject_TypeCheck((PyObject *)d, api->delivery_base) || !d->pos || !d->attempt || !d->id) {
            result = 0;
            goto done;
        }
        ds[j] = (PyObject *)d;
        triples[3 * j] = PyLong_AsUnsignedLongLong(d->pos);
        triples[3 * j + 1] = PyLong_AsUnsignedLongLong(d->attempt);
        triples[3 * j + 2] = PyLong_AsUnsignedLongLong(d->id);
        if (PyErr_Occurred()) goto done;
    }
    uint64_t acked = 0, now = clock_ns(CLOCK_MONOTONIC);
    int owed = 0, r;
    Py_ssize_t nbad = 0;
    if (t->logged) { /* one tag (above): the ack with its log entry */
        long fd = -1;
        uint64_t gen = 0;
        if (!wal_of(self, t, &fd, &gen)) {
            result = 0;
            goto done;
        }
        r = api->ack(t->seg, t->base, t->cap, triples[0], triples[1], triples[2], now, fd, gen, t->slot);
        if (r == api->r_expired) {
            bad[nbad++] = 0;
            r = 0;
        } else if (r >= 0) {
            acked = 1;
            owed = r;
            r = 0;
        }
    } else {
        r = api->ack_many(t->seg, t->base, t->cap, triples, (Py_ssize_t)k, now, t->slot, &acked, &owed, bad, &nbad);
    }
    if (r) { /* nothing changed: Python settles them (a busy lock, a dead holder repaired, a deleted queue) */
        result = r == api->r_ownerdead && repaired(self, t) < 0 ? -1 : 0;
        goto done;
    }
    /* settled (or found no longer leased): held no more, as Leases.settle drops them */
    PyObject *expired = NULL;
    if (nbad) {
        expired = PyList_New(nbad);
        if (!expired) goto done;
        for (Py_ssize_t j = 0; j < nbad; j++) {
            Py_INCREF(ds[bad[j]]);
            PyList_SET_ITEM(expired, j, ds[bad[j]]);
        }
    }
    for (uint64_t j = 0; j < k; j++)
        if (PyDict_DelItem(held, PyList_GET_ITEM(keys, (Py_ssize_t)j)) < 0) PyErr_Clear();
    if (owed && call_engine(self->wake_producers, t, NULL) < 0) {
        Py_XDECREF(expired);
        goto done;
    }
    if (expired) { /* the queue's own error for them, answered as Python answers it */
        PyObject *error = PyObject_CallFunctionObjArgs(self->expired_error, t->q, expired, NULL);
        Py_DECREF(expired);
        PyObject *frame = error ? PyObject_CallFunction(self->error_frame, "iIO", MSG_ACK, msg_id, error) : NULL;
        Py_XDECREF(error);
        result = reply_bytes(self, frame) < 0 ? -1 : 2; /* (2: served, with an error reply) */
        goto done;
    }
    result = reply_one(self, MSG_ACK, msg_id, "acked", acked) < 0 ? -1 : 1;
done:
    Py_XDECREF(held);
    Py_XDECREF(pushed);
    Py_XDECREF(keys);
    PyMem_Free(ds);
    PyMem_Free(heap);
    return result;
}

/* ---- Plain */
static int plain_traverse(Plain *self, visitproc visit, void *arg) {
    Py_VISIT(self->handles);
    Py_VISIT(self->attach);
    Py_VISIT(self->tags);
    Py_VISIT(self->consumed);
    Py_VISIT(self->error_frame);
    Py_VISIT(self->kept_alive);
    Py_VISIT(self->count);
    Py_VISIT(self->c_arguments);
    Py_VISIT(self->wal_descriptor);
    Py_VISIT(self->wake_consumers);
    Py_VISIT(self->wake_producers);
    Py_VISIT(self->repair_lock);
    Py_VISIT(self->expired_error);
    Py_VISIT(self->rsmall);
    Py_VISIT(self->notify);
    Py_VISIT(self->touch);
    Py_VISIT(self->time);
    Py_VISIT(self->queues);
    for (int i = 0; i < N_TARGETS; i++) {
        Py_VISIT(self->targets[i].name);
        Py_VISIT(self->targets[i].q);
    }
    return 0;
}

static int plain_clear(Plain *self) {
    Py_CLEAR(self->handles);
    Py_CLEAR(self->attach);
    Py_CLEAR(self->tags);
    Py_CLEAR(self->consumed);
    Py_CLEAR(self->error_frame);
    Py_CLEAR(self->kept_alive);
    Py_CLEAR(self->count);
    Py_CLEAR(self->c_arguments);
    Py_CLEAR(self->wal_descriptor);
    Py_CLEAR(self->wake_consumers);
    Py_CLEAR(self->wake_producers);
    Py_CLEAR(self->repair_lock);
    Py_CLEAR(self->expired_error);
    for (int i = 0; i < N_TARGETS; i++) target_clear(&self->targets[i]);
    Py_CLEAR(self->rsmall);
    Py_CLEAR(self->notify);
    Py_CLEAR(self->touch);
    Py_CLEAR(self->time);
    Py_CLEAR(self->queues);
    if (self->rbuf.obj) PyBuffer_Release(&self->rbuf);
    return 0;
}

static void plain_dealloc(Plain *self) {
    PyObject_GC_UnTrack(self);
    plain_clear(self);
    PyMem_Free(self->out.buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Plain(handles, attach, tags, consumed, error_frame, kept_alive, engine, max_frame_bytes) */
static int plain_init(Plain *self, PyObject *args, PyObject *kw) {
    PyObject *handles, *attach, *tags, *consumed, *error_frame, *kept_alive, *engine;
    unsigned long long max_frame;
    static char *kwlist[] = {"handles", "attach", "tags", "consumed", "error_frame", "kept_alive", "engine",
                             "max_frame_bytes", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOOOO!OK", kwlist, &PyDict_Type, &handles, &attach, &tags,
                                     &consumed, &error_frame, &PyDict_Type, &kept_alive, &engine, &max_frame))
        return -1;
    plain_clear(self);
    static const char *calls[] = {"c_arguments", "wal_descriptor", "wake_consumers", "wake_producers", "repair_lock",
                                  "expired_error"};
    PyObject **slots[] = {&self->c_arguments, &self->wal_descriptor, &self->wake_consumers, &self->wake_producers,
                          &self->repair_lock, &self->expired_error};
    for (int i = 0; i < 6; i++)
        if (!(*slots[i] = PyObject_GetAttrString(engine, calls[i]))) return -1;
    Py_INCREF(handles);
    Py_INCREF(attach);
    Py_INCREF(tags);
    Py_INCREF(consumed);
    Py_INCREF(error_frame);
    Py_INCREF(kept_alive);
    self->handles = handles;
    self->attach = attach;
    self->tags = tags;
    self->consumed = consumed;
    self->error_frame = error_frame;
    self->kept_alive = kept_alive;
    Py_INCREF(Py_None);
    self->count = Py_None;
    self->max_frame_bytes = max_frame;
    return 0;
}

static int attr_true(PyObject *o, PyObject *name);

/* 1 where queue ``name`` has requests waiting on this loop (a live line in one of the server's
 * AttachedHandles of queues, as its ``notify`` looks), 0 where not or where unknown, -1 on an error */
static int awaited(Plain *self, PyObject *name) {
    if (!self->queues) return 0;
    PyObject *peers = PyObject_GetAttr(self->queues, s_peers);
    if (!peers) return -1;
    PyObject *seq = PySequence_Fast(peers, "AttachedHandles.peers");
    Py_DECREF(peers);
    if (!seq) return -1;
    int r = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq) && !r; i++) {
        PyObject *lines = PyObject_GetAttr(PySequence_Fast_GET_ITEM(seq, i), s_lines);
        if (!lines) {
            r = -1;
            break;
        }
        PyObject *line = PyDict_Check(lines) ? PyDict_GetItemWithError(lines, name) : NULL;
        if (line) r = attr_true(line, s_live);
        else if (PyErr_Occurred()) r = -1;
        Py_DECREF(lines);
    }
    Py_DECREF(seq);
    return r;
}

/* serve(data, leases, max_frame_bytes, wait=None) -> (bytes used, replies, requests served, queues put
 * to) or None. ``wait(msg_id, q, most, rows, wait_ms)``: lines up a CONSUME that found nothing (True)
 * or leaves it to Python (False); None: Python makes every wait. */
static PyObject *serve_bytes(Plain *self, const uint8_t *data, size_t size, PyObject *leases, uint64_t max_frame,
                             PyObject *wait) {
    size_t pos = 0;
    long served = 0;
    PyObject *touched = PyList_New(0), *result = NULL;
    if (!touched) goto out;
    self->out.len = 0;
    self->serving = 1;
    int timed = self->count != Py_None;
    while (size - pos >= WIRE_HEADER) {
        WireHeader h;
        wire_header(data + pos, &h);
        if (h.magic != WIRE_MAGIC || h.version != WIRE_VERSION || h.status != WIRE_OK || h.length > max_frame ||
            size - pos - WIRE_HEADER < h.length || h.type < MSG_PRODUCE || h.type > MSG_ACK)
            break;
        MpIn in = {data + pos + WIRE_HEADER, data + pos + WIRE_HEADER + h.length};
        uint64_t t0 = timed ? clock_ns(CLOCK_MONOTONIC) : 0;
        size_t before = self->out.len;
        int r = h.type == MSG_PRODUCE ? produce(self, &in, h.msg_id, touched)
                : h.type == MSG_PRODUCE_BATCH ? produce_batch(self, &in, h.msg_id, touched)
                : h.type == MSG_CONSUME ? consume(self, &in, h.msg_id, leases, wait, touched)
                : ack(self, &in, h.msg_id, leases);
        if (r < 0) goto out;
        if (!r) {
            self->out.len = before;
            break;
        }
        if (timed) { /* as Metrics.timed counts a request: its type, seconds, and status (None: it waits) */
            double seconds = (double)(clock_ns(CLOCK_MONOTONIC) - t0) / 1e9;
            PyObject *c;
            if (self->out.len == before) {
                c = PyObject_CallFunction(self->count, "idO", h.type, seconds, Py_None);
            } else {
                WireHeader reply;
                wire_header(self->out.buf + before, &reply);
                c = PyObject_CallFunction(self->count, "idI", h.type, seconds, (unsigned)reply.status);
            }
            if (!c) goto out;
            Py_DECREF(c);
        }
        pos += WIRE_HEADER + h.length;
        served++;
        if ((h.type == MSG_PRODUCE || h.type == MSG_PRODUCE_BATCH) && pos < size) {
            /* a put to a queue with gets waiting, more frames behind it: served here no further, so that
             * its waiters are answered (``notify``) before the next frame, as a PRODUCE in Python does */
            int w = awaited(self, PyList_GET_ITEM(touched, PyList_GET_SIZE(touched) - 1));
            if (w < 0) goto out;
            if (w) break;
        }
    }
    if (!served) {
        Py_INCREF(Py_None);
        result = Py_None;
        goto out;
    }
    PyObject *replies = PyBytes_FromStringAndSize((const char *)self->out.buf, (Py_ssize_t)self->out.len);
    if (replies) result = Py_BuildValue("(nNlO)", (Py_ssize_t)pos, replies, served, touched);
out:
    self->serving = 0;
    reply_reset(self);
    Py_XDECREF(touched);
    return result;
}

static PyObject *plain_serve(Plain *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "serve(data, leases, max_frame_bytes, wait=None)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    uint64_t max_frame = PyLong_AsUnsignedLongLong(args[2]);
    PyObject *result = max_frame == (uint64_t)-1 && PyErr_Occurred()
                           ? NULL
                           : serve_bytes(self, view.buf, (size_t)view.len, args[1], max_frame,
                                         nargs == 4 ? args[3] : Py_None);
    PyBuffer_Release(&view);
    return result;
}

/* ---- a read served whole: Connection.get_buffer and take's common case, in C */

/* 1 where ``name`` of ``o`` is true, 0 where false, -1 on an error */
static int attr_true(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* 1 where ``name`` of ``(o).(inner)`` is true (``inner`` NULL: of ``o``), as attr_true */
static int inner_true(PyObject *o, PyObject *inner, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, inner);
    if (!v) return -1;
    int r = attr_true(v, name);
    Py_DECREF(v);
    return r;
}

/* Whether ``conn`` reads at a frame's start, holding nothing: not closing, no budget reserved,
 * nothing in its decoder (-1: an error). Its read then goes into ``rsmall`` and is served here. */
static int holds_nothing(PyObject *conn) {
    int r;
    if ((r = attr_true(conn, s_closing)) != 0) return r < 0 ? -1 : 0;
    if ((r = attr_true(conn, s_reserved)) != 0) return r < 0 ? -1 : 0;
    if ((r = inner_true(conn, s_decoder, s_buffered)) != 0) return r < 0 ? -1 : 0;
    return 1;
}

/* reads(rview, small, notify, touch, time, queues): what ``read`` and ``buffer`` need of the server,
 * and its AttachedHandles of queues (a put to a queue with waiting gets ends a serve: ``awaited``) */
static PyObject *plain_reads(Plain *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "reads(rview, small, notify, touch, time, queues)");
        return NULL;
    }
    if (self->rbuf.obj) PyBuffer_Release(&self->rbuf);
    if (PyObject_GetBuffer(args[0], &self->rbuf, PyBUF_SIMPLE) < 0) return NULL;
    PyObject **slots[] = {&self->rsmall, &self->notify, &self->touch, &self->time, &self->queues};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(args[i + 1]);
        Py_XSETREF(*slots[i], args[i + 1]);
    }
    Py_RETURN_NONE;
}

/* buffer(conn) -> the view a connection that holds nothing reads into, or None (``get_buffer`` then
 * works it out) */
static PyObject *plain_buffer(Plain *self, PyObject *conn) {
    if (!self->rsmall) Py_RETURN_NONE;
    int r = holds_nothing(conn);
    if (r < 0) return NULL;
    if (!r) Py_RETURN_NONE;
    Py_INCREF(self->rsmall);
    return self->rsmall;
}

static PyObject *call_method0(PyObject *o, PyObject *name) {
    return PyObject_CallMethodNoArgs(o, name);
}

/* read(conn, nbytes) -> True: the read's every frame served here and answered, with what
 * Connection.take does after (the requests counted, the gets waiting on the queues put to
 * answered, the busy poll touched, the clocks, the replies written); a tuple: ``serve``'s, the
 * read served only in part (``take`` goes on with the rest); False: nothing served; None:
 * not tried (the connection is mid-frame, paused, or holds bytes). */
static PyObject *plain_read(Plain *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "read(conn, nbytes)");
        return NULL;
    }
    PyObject *conn = args[0];
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[1]);
    if (nbytes < 0) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    if (!self->rbuf.obj || nbytes > self->rbuf.len) Py_RETURN_NONE;
    int r;
    if ((r = holds_nothing(conn)) <= 0) return r < 0 ? NULL : Py_NewRef(Py_None);
    if ((r = inner_true(conn, s_bounds, s_got)) != 0) return r < 0 ? NULL : Py_NewRef(Py_None);
    if ((r = attr_true(conn, s_write_paused)) != 0) return r < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *leases = PyObject_GetAttr(conn, s_leases), *decoder = PyObject_GetAttr(conn, s_decoder);
    PyObject *wait = PyObject_GetAttr(conn, s_wait_plain), *mfb = decoder ? PyObject_GetAttr(decoder, s_max_frame_bytes) : NULL;
    PyObject *served = NULL, *result = NULL;
    if (!leases || !wait || !mfb) goto done;
    uint64_t max_frame = PyLong_AsUnsignedLongLong(mfb);
    if (max_frame == (uint64_t)-1 && PyErr_Occurred()) goto done;
    served = serve_bytes(self, self->rbuf.buf, (size_t)nbytes, leases, max_frame, wait);
    if (!served) goto done;
    if (served == Py_None) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    Py_ssize_t used = PyLong_AsSsize_t(PyTuple_GET_ITEM(served, 0));
    if (used < nbytes) { /* the rest is Python's: Connection.take goes on from serve's result */
        result = Py_NewRef(served);
        goto done;
    }
    /* Connection.served: the requests counted, the gets waiting on the queues put to answered first */
    PyObject *replies = PyTuple_GET_ITEM(served, 1), *count = PyTuple_GET_ITEM(served, 2),
             *touched = PyTuple_GET_ITEM(served, 3);
    PyObject *requests = PyObject_GetAttr(conn, s_requests);
    PyObject *sum = requests ? PyNumber_Add(requests, count) : NULL;
    Py_XDECREF(requests);
    if (!sum) goto done;
    r = PyObject_SetAttr(conn, s_requests, sum);
    Py_DECREF(sum);
    if (r < 0 || PyObject_SetAttr(conn, s_served_bytes, PyTuple_GET_ITEM(served, 0)) < 0) goto done;
    Py_ssize_t nt = PyList_GET_SIZE(touched);
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *name = PyList_GET_ITEM(touched, i);
        int seen = 0; /* each queue once, in the order first put to */
        for (Py_ssize_t j = 0; j < i && !seen; j++) {
            seen = PyObject_RichCompareBool(PyList_GET_ITEM(touched, j), name, Py_EQ);
            if (seen < 0) goto done;
        }
        if (seen) continue;
        PyObject *x = PyObject_CallOneArg(self->notify, name);
        if (!x) goto done;
        Py_DECREF(x);
    }
    /* the client's next request may follow its reply: looked for awake (LoopSpin.touch); the clocks */
    PyObject *now = PyObject_CallNoArgs(self->time);
    if (!now) goto done;
    PyObject *targs[2] = {conn, now};
    PyObject *x = PyObject_Vectorcall(self->touch, targs, 2, NULL);
    PyObject *clocks = x ? PyObject_GetAttr(conn, s_clocks) : NULL;
    Py_XDECREF(x);
    r = clocks && PyObject_SetAttr(clocks, s_frame_started, Py_None) == 0 &&
        PyObject_SetAttr(clocks, s_last_active, now) == 0;
    Py_XDECREF(clocks);
    Py_DECREF(now);
    if (!r) goto done;
    if (PyBytes_GET_SIZE(replies)) { /* (none: they wait) */
        if ((r = attr_true(conn, s_eof_sent)) < 0) goto done;
        if (!r) {
            PyObject *transport = PyObject_GetAttr(conn, s_transport);
            if (!transport) goto done;
            PyObject *closing = call_method0(transport, s_is_closing);
            r = closing ? PyObject_IsTrue(closing) : -1;
            Py_XDECREF(closing);
            if (r == 0) {
                x = PyObject_CallMethodOneArg(transport, s_write, replies);
                r = x ? 0 : -1;
                Py_XDECREF(x);
            }
            Py_DECREF(transport);
            if (r < 0) goto done;
        }
    }
    /* then, as Connection.take: ``account`` unless it reads on at a frame's boundary */
    if ((r = attr_true(conn, s_closing)) != 0) {
        if (r > 0) result = Py_NewRef(Py_True);
        goto done;
    }
    int more = attr_true(conn, s_reading);
    if (more == 1) more = attr_true(conn, s_write_paused) == 1 || attr_true(conn, s_budget_wait) == 1 ? 0 : 1;
    if (PyErr_Occurred()) goto done;
    if (!more) {
        x = call_method0(conn, s_account);
        if (!x) goto done;
        Py_DECREF(x);
    }
    result = Py_NewRef(Py_True);
done:
    Py_XDECREF(served);
    Py_XDECREF(leases);
    Py_XDECREF(decoder);
    Py_XDECREF(wait);
    Py_XDECREF(mfb);
    return result;
}

/* deliver(leases, name, q, msg_id, most, rows) -> bytes, None or False: a waiting CONSUME of queue
 * ``name`` (handle ``q``) tried again (handlers' plain_take): its reply frame, what ``consume`` would
 * have answered had it found messages; None: nothing ready; False: Python's take, nothing done (a
 * handle C does not serve, one replaced, anything the engine hands back). */
static PyObject *plain_deliver(Plain *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "deliver(leases, name, q, msg_id, most, rows)");
        return NULL;
    }
    Py_ssize_t qn;
    const char *qs = PyUnicode_Check(args[1]) ? PyUnicode_AsUTF8AndSize(args[1], &qn) : NULL;
    unsigned long msg_id = PyLong_AsUnsignedLong(args[3]);
    unsigned long long most = PyLong_AsUnsignedLongLong(args[4]);
    int rows = PyObject_IsTrue(args[5]);
    if (!qs || PyErr_Occurred() || rows < 0 || msg_id > UINT32_MAX || !most || most > (1u << 24) || self->serving) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    Target *t = target_of(self, qs, (uint64_t)qn);
    if (!t || t->q != args[2] || !t->ok || !t->plain || !has_slot(self, t)) Py_RETURN_FALSE;
    self->out.len = 0;
    int empty;
    int r = take_reply(self, t, (uint32_t)msg_id, args[0], most, rows, &empty);
    PyObject *result = NULL;
    if (r > 0)
        result = PyBytes_FromStringAndSize((const char *)self->out.buf, (Py_ssize_t)self->out.len);
    else if (!r)
        result = Py_NewRef(empty ? Py_None : Py_False);
    reply_reset(self);
    return result;
}

/* timed(count): a metrics hook called (type, seconds, status) per request served; None: off */
static PyObject *plain_timed(Plain *self, PyObject *count) {
    Py_INCREF(count);
    Py_XSETREF(self->count, count);
    Py_RETURN_NONE;
}

static PyObject *plain_forget(Plain *self, PyObject *Py_UNUSED(ignored)) {
    for (int i = 0; i < N_TARGETS; i++) target_clear(&self->targets[i]);
    Py_RETURN_NONE;
}

static PyMethodDef plain_methods[] = {
    {"serve", (PyCFunction)(void (*)(void))plain_serve, METH_FASTCALL,
     "serve(data, leases, max_frame_bytes, wait=None) -> (bytes used, replies, requests, queues put to), or None: "
     "the plain frames at the start of a read, served"},
    {"deliver", (PyCFunction)(void (*)(void))plain_deliver, METH_FASTCALL,
     "deliver(leases, name, q, msg_id, most, rows) -> a waiting CONSUME's reply frame, None (nothing ready) or "
     "False (Python's take)"},
    {"timed", (PyCFunction)plain_timed, METH_O, "timed(count): count(type, seconds, status) per request (None: off)"},
    {"forget", (PyCFunction)plain_forget, METH_NOARGS, "drop every handle kept (the server stops)"},
    {"reads", (PyCFunction)(void (*)(void))plain_reads, METH_FASTCALL,
     "reads(rview, small, notify, touch, time, queues): the server's receive buffer, what a read served whole "
     "calls, and its queues' waiting lines"},
    {"buffer", (PyCFunction)plain_buffer, METH_O,
     "buffer(conn) -> the view a connection holding nothing reads into, or None"},
    {"read", (PyCFunction)(void (*)(void))plain_read, METH_FASTCALL,
     "read(conn, nbytes) -> True (served whole and answered), serve's tuple (in part), False (none) or None "
     "(not tried)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlainType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmq.server._plain.Plain",
    .tp_basicsize = sizeof(Plain),
    .tp_dealloc = (destructor)plain_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A server's plain requests in C: serve(data, leases, max_frame_bytes)",
    .tp_traverse = (traverseproc)plain_traverse,
    .tp_clear = (inquiry)plain_clear,
    .tp_methods = plain_methods,
    .tp_init = (initproc)plain_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "shmq.server._plain",
                                    "The server's plain requests in C (issue 44).", -1, NULL};

#define INTERN(var, text)                                                                                              \
    if (!(var = PyUnicode_InternFromString(text))) return NULL

PyMODINIT_FUNC PyInit__plain(void) {
    api = (ShmqFastAPI *)PyCapsule_Import(SHMQ_FAST_API_CAPSULE, 0);
    if (!api) return NULL;
    if (api->version != SHMQ_FAST_API_VERSION) {
        PyErr_Format(PyExc_ImportError, "shmq.engine._fast's C API is version %d, this extension wants %d",
                     api->version, SHMQ_FAST_API_VERSION);
        return NULL;
    }
    INTERN(s_held, "held");
    INTERN(s_pushed, "pushed");
    INTERN(s_closing, "closing");
    INTERN(s_reserved, "reserved");
    INTERN(s_decoder, "decoder");
    INTERN(s_buffered, "buffered");
    INTERN(s_bounds, "bounds");
    INTERN(s_got, "got");
    INTERN(s_write_paused, "write_paused");
    INTERN(s_leases, "leases");
    INTERN(s_max_frame_bytes, "max_frame_bytes");
    INTERN(s_wait_plain, "wait_plain");
    INTERN(s_requests, "requests");
    INTERN(s_served_bytes, "served_bytes");
    INTERN(s_clocks, "clocks");
    INTERN(s_frame_started, "frame_started");
    INTERN(s_last_active, "last_active");
    INTERN(s_eof_sent, "eof_sent");
    INTERN(s_transport, "transport");
    INTERN(s_is_closing, "is_closing");
    INTERN(s_write, "write");
    INTERN(s_reading, "reading");
    INTERN(s_budget_wait, "budget_wait");
    INTERN(s_account, "account");
    INTERN(s_peers, "peers");
    INTERN(s_lines, "lines");
    INTERN(s_live, "live");
    if (PyType_Ready(&PlainType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&PlainType);
    if (PyModule_AddObject(m, "Plain", (PyObject *)&PlainType) < 0) {
        Py_DECREF(&PlainType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
