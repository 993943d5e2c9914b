/* The engine's three hot paths in C: put, get (the plain frontier take) and ack; and a
 * bulk read of a stream partition into Arrow buffers (read_columns).
 *
 * Strategy: these are the pure-Python fast paths of shmq/engine/queue.py (Queue.put,
 * Queue._take_one, Queue._ack_one) done with the same loads and stores in the same
 * order, on the same segment layout (shmq/engine/layout.py, through the generated _layout.h). They only ever take the
 * uncontended case: anything else -- a busy lock, a dead lock holder, a full ring, a
 * requeued message, housekeeping due -- is handed back to the Python code, which
 * handles every case. The commit stores (the tail of a put, the status word of a take
 * or an ack) are release stores, so the compiler cannot move the record's writes after
 * them. The GIL stays held: nothing here blocks.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "_layout.h" /* generated from layout.py; tests/test_layout.py fails while it is stale */

#define WAL_MAX_PAYLOAD 4096 /* larger entries take the Python path (zlib's faster CRC) */

/* results other than success */
#define R_BUSY (-1)      /* lock busy: not taken */
#define R_OWNERDEAD (-2) /* lock taken from a dead holder: the caller repairs, then unlocks */
#define R_FALLBACK (-3)  /* not a fast-path case: lock released, nothing changed */
#define R_EXPIRED (-4)   /* ack: the delivery is no longer leased */
#define R_DELETED (-5)   /* the queue was deleted */

#define HOT(seg) ((uint64_t *)(seg) + HOT_W)
#define CNT(seg) ((uint64_t *)(seg) + COUNTERS_W)
#define U64(p) (*(uint64_t *)(p))
#define U32(p) (*(uint32_t *)(p))

/* 0 when locked; else R_BUSY or R_OWNERDEAD (then the lock is held). */
static inline int lock(char *seg) {
    int rc = pthread_mutex_trylock((pthread_mutex_t *)(seg + MUTEX_OFF));
    if (rc == 0) return 0;
    return rc == EOWNERDEAD ? R_OWNERDEAD : R_BUSY;
}

static inline void unlock(char *seg) { pthread_mutex_unlock((pthread_mutex_t *)(seg + MUTEX_OFF)); }

/* ---- write-ahead log entries (docs/FORMAT.md): head "WAL"+op, hdr_len, body_len, attempt,
 * msg_id, enqueued_ns (32 bytes), headers, body, CRC-32 (zlib's) of all that. */
static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32_of(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n--) c = crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* Fill a log entry's head and CRC in `e` (its headers and body already in place). */
static size_t log_entry(unsigned char *e, int op, uint64_t hl, uint64_t bl, uint64_t attempt, uint64_t msg_id,
                        uint64_t enq) {
    memcpy(e + LOG_TAG, LOG_TAG_BYTES, 3);
    e[LOG_TAG + 3] = (unsigned char)op;
    U32(e + LOG_HDR_LEN) = (uint32_t)hl;
    U32(e + LOG_BODY_LEN) = (uint32_t)bl;
    U32(e + LOG_ATTEMPT) = (uint32_t)attempt;
    memcpy(e + LOG_MSG_ID, &msg_id, 8);
    memcpy(e + LOG_ENQ_NS, &enq, 8);
    size_t n = LOG_HEAD + hl + bl;
    uint32_t crc = crc32_of(e, n);
    memcpy(e + n, &crc, 4);
    return n + 4;
}

/* Is the caller's descriptor for the current log generation, and no fsync owed per entry? */
static inline int wal_usable(char *seg, uint64_t gen) {
    uint64_t *w = (uint64_t *)seg;
    return gen && w[WALCFG_W] == gen && (w[WALCFG_W + 1] & 0xFFFFFFFFu) != WAL_ALWAYS;
}

/* Append (lock held); 0, or -1 with errno set. All or nothing: a failed append (a full
 * disk) is cut back off the log; if even that fails, later appends go to the next
 * generation (as Queue._wal_cut does), so none lands after the damage. */
static int wal_write(char *seg, int fd, const unsigned char *e, size_t n) {
    uint64_t *w = (uint64_t *)seg;
    size_t done = 0;
    while (done < n) {
        ssize_t k = write(fd, e + done, n - done);
        if (k < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            if (done && ftruncate(fd, (off_t)w[WAL_WORDS_W]) != 0) {
                w[WALCFG_W] += 1;
                w[WAL_WORDS_W] = w[WAL_WORDS_W + 1] = 0;
            }
            errno = err;
            return -1;
        }
        done += (size_t)k;
    }
    w[WAL_WORDS_W] += n;
    return 0;
}

static int parse_u64s(PyObject *const *args, Py_ssize_t n, uint64_t *out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (out[i] == (uint64_t)-1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* put(seg, base, cap, body, hraw, enq_ns, wal_fd, wal_gen)
 *   -> msg_id << 1 | (1 if a consumer must be woken), or R_*
 * wal_fd < 0: no log; else the PUT entry is appended to it before the commit */
static PyObject *fast_put(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[3], enq;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "put takes 8 arguments");
        return NULL;
    }
    long wal_fd = PyLong_AsLong(args[6]);
    if (wal_fd == -1 && PyErr_Occurred()) return NULL;
    uint64_t wal_gen = PyLong_AsUnsignedLongLong(args[7]);
    if (wal_gen == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    if (parse_u64s(args, 3, v) < 0) return NULL;
    if (!PyBytes_CheckExact(args[3]) || !PyBytes_CheckExact(args[4])) return PyLong_FromLong(R_FALLBACK);
    enq = PyLong_AsUnsignedLongLong(args[5]);
    if (enq == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    char *seg = (char *)(uintptr_t)v[0];
    uint64_t base = v[1], cap = v[2];
    const char *body = PyBytes_AS_STRING(args[3]), *hraw = PyBytes_AS_STRING(args[4]);
    uint64_t bl = (uint64_t)PyBytes_GET_SIZE(args[3]), hl = (uint64_t)PyBytes_GET_SIZE(args[4]);
    uint64_t size = (REC_SIZE + 7 + hl + bl) & ~(uint64_t)7;
    unsigned char *entry = NULL;
    if (wal_fd >= 0) {
        if (hl + bl > WAL_MAX_PAYLOAD) return PyLong_FromLong(R_FALLBACK);
        entry = PyMem_Malloc(LOG_HEAD + hl + bl + 4);
        if (!entry) return PyErr_NoMemory();
        memcpy(entry + LOG_HEAD, hraw, hl);
        memcpy(entry + LOG_HEAD + hl, body, bl);
    }

    int rc = lock(seg);
    if (rc) {
        PyMem_Free(entry);
        return PyLong_FromLong(rc);
    }
    uint64_t *h = HOT(seg);
    uint64_t tail = h[H_TAIL], off = tail % cap;
    if (h[H_DELETED] || size > cap - off || tail + size - h[H_HEAD] > cap || (entry && !wal_usable(seg, wal_gen))) {
        unlock(seg);
        PyMem_Free(entry);
        return PyLong_FromLong(R_FALLBACK);
    }
    char *a = seg + base + off;
    uint64_t msg_id = h[H_NEXT_ID];
    if (entry) { /* logged before the commit below */
        size_t n = log_entry(entry, LOG_PUT, hl, bl, 0, msg_id, enq);
        if (wal_write(seg, (int)wal_fd, entry, n) < 0) {
            int err = errno;
            unlock(seg);
            PyMem_Free(entry);
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        PyMem_Free(entry);
    }
    U64(a + REC_STATUS) = ST_READY;
    U32(a + REC_LENGTH) = (uint32_t)size;
    U32(a + REC_BODY_LEN) = (uint32_t)bl;
    U32(a + REC_HDR_LEN) = (uint32_t)hl;
    U32(a + REC_FLAGS) = 0;
    U64(a + REC_MSG_ID) = msg_id;
    U64(a + REC_ENQ_NS) = enq;
    U64(a + REC_DEADLINE) = 0;
    if (hl) memcpy(a + REC_SIZE, hraw, hl);
    memcpy(a + REC_SIZE + hl, body, bl);
    __atomic_store_n(&h[H_TAIL], tail + size, __ATOMIC_RELEASE); /* commit */
    h[H_NEXT_ID] = msg_id + 1;
    h[H_READY] += 1;
    int post = 0;
    uint64_t cw = h[H_CWAIT];
    if (cw && cw > h[H_CPOSTED]) {
        h[H_CPOSTED] += 1;
        post = 1;
    }
    unlock(seg);
    return PyLong_FromUnsignedLongLong(msg_id << 1 | (uint64_t)post);
}

/* take modes (bits): settle as taken (auto-ack), and a body that is a view into the ring */
#define M_AUTOACK 1
#define M_VIEW 2

/* The body of the record at ring offset ``off``: a copy, or (M_VIEW) a read-only slice of
 * ``ring``, the caller's memoryview of the ring (so the view keeps the mapping alive). */
static PyObject *body_of(char *a, uint64_t off, uint64_t hl, uint64_t bl, int mode, PyObject *ring) {
    if (!(mode & M_VIEW)) return PyBytes_FromStringAndSize(a + REC_SIZE + hl, (Py_ssize_t)bl);
    uint64_t start = off + REC_SIZE + hl;
    PyObject *lo = PyLong_FromUnsignedLongLong(start), *hi = PyLong_FromUnsignedLongLong(start + bl);
    PyObject *sl = lo && hi ? PySlice_New(lo, hi, NULL) : NULL;
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    if (!sl) return NULL;
    PyObject *v = PyObject_GetItem(ring, sl);
    Py_DECREF(sl);
    return v;
}

/* The producer post owed after space was freed at ``pos`` (lock held): 1 or 0. */
static int freed_at(char *seg, uint64_t base, uint64_t cap, uint64_t pos, uint64_t head);

/* take(seg, base, cap, slot, vis_ns, max_deliveries or 0, now[, mode, ring])
 *   -> (pos, msg_id, attempt, body, hraw or None, enq_ns), or R_*; a record with flags (a priority
 *   level or an extension block) is left to the general take
 * (``now`` is the caller's monotonic clock in ns, so the Python and C paths share one clock)
 * mode M_AUTOACK: the record is settled (ACKED) as it is taken, and the tuple has a 7th item
 * (1) when a producer must be woken; M_VIEW: the body is a slice of ``ring`` */
static PyObject *fast_take(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[8] = {0};
    if (nargs != 7 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "take takes 7 or 9 arguments");
        return NULL;
    }
    if (parse_u64s(args, nargs == 9 ? 8 : 7, v) < 0) return NULL;
    char *seg = (char *)(uintptr_t)v[0];
    uint64_t base = v[1], cap = v[2], slot = v[3], vis_ns = v[4], maxdel = v[5], now = v[6];
    int mode = (int)v[7];
    PyObject *ring = nargs == 9 ? args[8] : NULL;

    int rc = lock(seg);
    if (rc) return PyLong_FromLong(rc);
    uint64_t *h = HOT(seg);
    uint64_t pos = h[H_FRONTIER], off = pos % cap, next_deadline = h[H_NEXT_DEADLINE];
    if (!(pos < h[H_TAIL] && !h[H_REQUEUED] && !h[H_DELETED] && cap - off >= REC_SIZE && now < next_deadline &&
          now < h[H_NEXT_LIVENESS] && !((uint64_t *)seg)[SPECIAL_W])) { /* special: the general take */
        unlock(seg);
        return PyLong_FromLong(R_FALLBACK);
    }
    char *a = seg + base + off;
    uint64_t status = U64(a), attempt = (status >> 32) + 1;
    if ((status & 0xFF) != ST_READY || (maxdel && attempt > maxdel) || U32(a + REC_FLAGS)) {
        unlock(seg); /* a priority level or an extension block: the general take */
        return PyLong_FromLong(R_FALLBACK);
    }
    uint64_t length = U32(a + REC_LENGTH), bl = U32(a + REC_BODY_LEN), hl = U32(a + REC_HDR_LEN),
             msg_id = U64(a + REC_MSG_ID), enq = U64(a + REC_ENQ_NS);
    /* copy out first: on a MemoryError nothing has changed */
    PyObject *body = body_of(a, off, hl, bl, mode, ring);
    PyObject *hraw = body && hl ? PyBytes_FromStringAndSize(a + REC_SIZE, (Py_ssize_t)hl) : NULL;
    if (!body || (hl && !hraw)) {
        unlock(seg);
        Py_XDECREF(body);
        return NULL;
    }
    int post = 0;
    if (mode & M_AUTOACK) {
        uint64_t head = h[H_HEAD];
        __atomic_store_n((uint64_t *)a, ST_ACKED | (slot << 8) | (attempt << 32), __ATOMIC_RELEASE); /* commit */
        h[H_FRONTIER] = pos + length;
        h[H_READY] -= 1;
        CNT(seg)[C_ACKED_TOTAL] += 1;
        post = freed_at(seg, base, cap, pos, head);
    } else {
        uint64_t until = now + vis_ns;
        U64(a + REC_DEADLINE) = until;
        __atomic_store_n((uint64_t *)a, ST_LEASED | (slot << 8) | (attempt << 32), __ATOMIC_RELEASE); /* commit */
        h[H_FRONTIER] = pos + length;
        h[H_READY] -= 1;
        h[H_IN_FLIGHT] += 1;
        if (until < next_deadline) h[H_NEXT_DEADLINE] = until;
    }
    if (attempt > 1) CNT(seg)[C_REDELIVERED_TOTAL] += 1;
    unlock(seg);
    if (!hraw) {
        hraw = Py_None;
        Py_INCREF(hraw);
    }
    if (post)
        return Py_BuildValue("(KKKNNKi)", (unsigned long long)pos, (unsigned long long)msg_id,
                             (unsigned long long)attempt, body, hraw, (unsigned long long)enq, post);
    return Py_BuildValue("(KKKNNK)", (unsigned long long)pos, (unsigned long long)msg_id,
                         (unsigned long long)attempt, body, hraw, (unsigned long long)enq);
}

static int advance_head(char *seg, uint64_t base, uint64_t cap);

/* take_many(seg, base, cap, slot, vis_ns, max_deliveries or 0, now, max_messages, max_bytes or 0, mode, ring)
 *   -> [(pos, msg_id, attempt, body, hraw or None, enq_ns), ...] (at least one), or R_*: the
 *   plain take repeated under one lock hold, from the frontier on, stopping at the first
 *   record it leaves to Python (requeued or special records, a due deadline, flags, an
 *   attempt past max_deliveries, the byte budget: the first message is always taken).
 *   mode as take's; with M_AUTOACK: ([...], 1 if a producer must be woken) */
static PyObject *fast_take_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[10];
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "take_many takes 11 arguments");
        return NULL;
    }
    if (parse_u64s(args, 10, v) < 0) return NULL;
    char *seg = (char *)(uintptr_t)v[0];
    uint64_t base = v[1], cap = v[2], slot = v[3], vis_ns = v[4], maxdel = v[5], now = v[6], maxn = v[7],
             budget = v[8];
    int mode = (int)v[9];
    PyObject *ring = args[10];
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    int rc = lock(seg);
    if (rc) {
        Py_DECREF(out);
        return PyLong_FromLong(rc);
    }
    uint64_t *h = HOT(seg);
    uint64_t pos = h[H_FRONTIER], tail = h[H_TAIL], next_deadline = h[H_NEXT_DEADLINE], head = h[H_HEAD];
    if (h[H_REQUEUED] || h[H_DELETED] || now >= next_deadline || now >= h[H_NEXT_LIVENESS] ||
        ((uint64_t *)seg)[SPECIAL_W]) {
        unlock(seg);
        Py_DECREF(out);
        return PyLong_FromLong(R_FALLBACK);
    }
    uint64_t until = now + vis_ns, taken = 0, redelivered = 0, first = 0;
    uint64_t settled = (mode & M_AUTOACK) ? ST_ACKED : ST_LEASED;
    int64_t left = (int64_t)budget; /* bytes of bodies and headers still allowed (budget 0: no limit) */
    while (taken < maxn && pos < tail) {
        uint64_t off = pos % cap;
        if (cap - off < REC_SIZE) { /* an implicit pad to the end of the lap */
            pos += cap - off;
            continue;
        }
        char *a = seg + base + off;
        uint64_t status = U64(a), length = U32(a + REC_LENGTH);
        if ((status & 0xFF) == ST_PAD) {
            pos += length;
            continue;
        }
        uint64_t attempt = (status >> 32) + 1, bl = U32(a + REC_BODY_LEN), hl = U32(a + REC_HDR_LEN);
        if ((status & 0xFF) != ST_READY || U32(a + REC_FLAGS) || (maxdel && attempt > maxdel)) break;
        if (budget) { /* as the Python take: the first is always taken, then what fits */
            if (taken && (int64_t)(bl + hl) > left) break;
            left -= (int64_t)(bl + hl);
        }
        /* copy out first: on a MemoryError this record is left as it is */
        PyObject *body = body_of(a, off, hl, bl, mode, ring);
        PyObject *hraw = body && hl ? PyBytes_FromStringAndSize(a + REC_SIZE, (Py_ssize_t)hl) : NULL;
        PyObject *t = NULL;
        if (body && (!hl || hraw)) {
            if (!hraw) {
                hraw = Py_None;
                Py_INCREF(hraw);
            }
            t = Py_BuildValue("(KKKNNK)", (unsigned long long)pos, (unsigned long long)U64(a + REC_MSG_ID),
                              (unsigned long long)attempt, body, hraw, (unsigned long long)U64(a + REC_ENQ_NS));
            body = hraw = NULL; /* the tuple holds them (or they were released with it) */
        }
        if (!t || PyList_Append(out, t) < 0) {
            Py_XDECREF(body);
            Py_XDECREF(hraw);
            Py_XDECREF(t);
            if (!taken) { /* nothing changed */
                unlock(seg);
                Py_DECREF(out);
                return NULL;
            }
            PyErr_Clear(); /* the ones taken are leased (or settled): hand them out */
            break;
        }
        Py_DECREF(t);
        if (!taken) first = pos;
        if (settled == ST_LEASED) U64(a + REC_DEADLINE) = until;
        __atomic_store_n((uint64_t *)a, settled | (slot << 8) | (attempt << 32), __ATOMIC_RELEASE); /* commit */
        pos += length;
        taken++;
        if (attempt > 1) redelivered++;
    }
    int post = 0;
    if (taken) {
        h[H_FRONTIER] = pos;
        h[H_READY] -= taken;
        if (settled == ST_ACKED) {
            CNT(seg)[C_ACKED_TOTAL] += taken;
            post = freed_at(seg, base, cap, first, head);
        } else {
            h[H_IN_FLIGHT] += taken;
            if (until < next_deadline) h[H_NEXT_DEADLINE] = until;
        }
        if (redelivered) CNT(seg)[C_REDELIVERED_TOTAL] += redelivered;
    }
    unlock(seg);
    if (!taken) {
        Py_DECREF(out);
        return PyLong_FromLong(R_FALLBACK);
    }
    if (mode & M_AUTOACK) return Py_BuildValue("(Ni)", out, post);
    return out;
}

/* ack_many(seg, base, cap, [pos, attempt, msg_id, ...], now)
 *   -> (acked, 1 if a producer must be woken else 0, [indices of those no longer leased]), or R_*:
 *   the plain ack repeated under one lock hold, for a queue with no log (the Python path logs) */
static PyObject *fast_ack_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[3], now;
    if (nargs != 5 || !PyList_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "ack_many takes 5 arguments, the fourth a list");
        return NULL;
    }
    if (parse_u64s(args, 3, v) < 0 || parse_u64s(args + 4, 1, &now) < 0) return NULL;
    char *seg = (char *)(uintptr_t)v[0];
    uint64_t base = v[1], cap = v[2];
    Py_ssize_t n = PyList_GET_SIZE(args[3]);
    if (n % 3) {
        PyErr_SetString(PyExc_ValueError, "ack_many: (pos, attempt, msg_id) triples");
        return NULL;
    }
    Py_ssize_t k = n / 3;
    uint64_t *d = PyMem_Malloc(sizeof(uint64_t) * (size_t)(n ? n : 1));
    Py_ssize_t *bad = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(k ? k : 1));
    if (!d || !bad) {
        PyMem_Free(d);
        PyMem_Free(bad);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* read before the lock: nothing fails under it */
        d[i] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(args[3], i));
        if (d[i] == (uint64_t)-1 && PyErr_Occurred()) {
            PyMem_Free(d);
            PyMem_Free(bad);
            return NULL;
        }
    }
    int rc = lock(seg);
    if (rc) {
        PyMem_Free(d);
        PyMem_Free(bad);
        return PyLong_FromLong(rc);
    }
    uint64_t *h = HOT(seg);
    if (h[H_DELETED]) {
        unlock(seg);
        PyMem_Free(d);
        PyMem_Free(bad);
        return PyLong_FromLong(R_DELETED);
    }
    uint64_t head = h[H_HEAD], tail = h[H_TAIL], done = 0;
    Py_ssize_t nbad = 0;
    int freed = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        uint64_t pos = d[3 * i], attempt = d[3 * i + 1], msg_id = d[3 * i + 2];
        char *a = seg + base + pos % cap;
        uint64_t w = pos < head || pos >= tail ? 0 : U64(a);
        if ((w & 0xFF) != ST_LEASED || (w >> 32) != attempt || U64(a + REC_MSG_ID) != msg_id ||
            U64(a + REC_DEADLINE) <= now) {
            bad[nbad++] = i; /* (one named twice is acked once, as two calls would) */
            continue;
        }
        __atomic_store_n((uint64_t *)a, (w & ~(uint64_t)0xFF) | ST_ACKED, __ATOMIC_RELEASE); /* commit */
        done++;
        if (pos == head || (pos % cap == 0 && pos - head < cap)) freed = 1; /* first after the head (or a pad) */
    }
    h[H_IN_FLIGHT] -= done;
    CNT(seg)[C_ACKED_TOTAL] += done;
    int post = 0;
    if (freed && advance_head(seg, base, cap)) {
        uint64_t pw = h[H_PWAIT];
        if (pw && pw > h[H_PPOSTED]) {
            h[H_PPOSTED] += 1;
            post = 1;
        }
    }
    unlock(seg);
    PyMem_Free(d);
    PyObject *badlist = PyList_New(nbad);
    if (!badlist) {
        PyMem_Free(bad);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nbad; i++) {
        PyObject *x = PyLong_FromSsize_t(bad[i]);
        if (!x) {
            Py_DECREF(badlist);
            PyMem_Free(bad);
            return NULL;
        }
        PyList_SET_ITEM(badlist, i, x);
    }
    PyMem_Free(bad);
    return Py_BuildValue("(KiN)", (unsigned long long)done, post, badlist);
}

/* Reclaim settled records and pads at the head (lock held); 1 if the head moved. */
static int advance_head(char *seg, uint64_t base, uint64_t cap) {
    uint64_t *h = HOT(seg);
    uint64_t head = h[H_HEAD], start = head, tail = h[H_TAIL];
    while (head < tail) {
        uint64_t rem = cap - head % cap, p = rem < REC_SIZE ? head + rem : head;
        if (p >= tail) {
            head = tail;
            break;
        }
        char *a = seg + base + p % cap;
        uint64_t st = U64(a) & 0xFF;
        if (st != ST_ACKED && st != ST_PAD) break;
        head = p + U32(a + REC_LENGTH);
    }
    if (head == start) return 0;
    h[H_HEAD] = head;
    if (h[H_FRONTIER] < head) h[H_FRONTIER] = head;
    if (h[H_READY_POS] < head) h[H_READY_POS] = head;
    return 1;
}

/* After the record at ``pos`` was settled (lock held; ``head`` read before): reclaim
 * space if it was the first after the head (or after a pad at the head); 1 if a sleeping
 * producer is owed a post. */
static int freed_at(char *seg, uint64_t base, uint64_t cap, uint64_t pos, uint64_t head) {
    uint64_t *h = HOT(seg);
    if ((pos == head || (pos % cap == 0 && pos - head < cap)) && advance_head(seg, base, cap)) {
        uint64_t pw = h[H_PWAIT];
        if (pw && pw > h[H_PPOSTED]) {
            h[H_PPOSTED] += 1;
            return 1;
        }
    }
    return 0;
}

/* ack(seg, base, cap, pos, attempt, msg_id, now, wal_fd, wal_gen)
 *   -> 1 if a producer must be woken, else 0; or R_*
 * wal_fd < 0: no log; else the ACK entry is appended to it before the commit */
static PyObject *fast_ack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[7];
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "ack takes 9 arguments");
        return NULL;
    }
    if (parse_u64s(args, 7, v) < 0) return NULL;
    long wal_fd = PyLong_AsLong(args[7]);
    if (wal_fd == -1 && PyErr_Occurred()) return NULL;
    uint64_t wal_gen = PyLong_AsUnsignedLongLong(args[8]);
    if (wal_gen == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    char *seg = (char *)(uintptr_t)v[0];
    uint64_t base = v[1], cap = v[2], pos = v[3], attempt = v[4], msg_id = v[5], now = v[6];

    int rc = lock(seg);
    if (rc) return PyLong_FromLong(rc);
    uint64_t *h = HOT(seg);
    if (h[H_DELETED]) {
        unlock(seg);
        return PyLong_FromLong(R_DELETED);
    }
    uint64_t head = h[H_HEAD];
    char *a = seg + base + pos % cap;
    uint64_t w = U64(a);
    if (pos < head || pos >= h[H_TAIL] || (w & 0xFF) != ST_LEASED || (w >> 32) != attempt ||
        U64(a + REC_MSG_ID) != msg_id || U64(a + REC_DEADLINE) <= now) {
        unlock(seg);
        return PyLong_FromLong(R_EXPIRED);
    }
    if (wal_fd >= 0) { /* logged before the commit below */
        unsigned char entry[LOG_HEAD + 4];
        if (!wal_usable(seg, wal_gen)) {
            unlock(seg);
            return PyLong_FromLong(R_FALLBACK);
        }
        size_t n = log_entry(entry, LOG_ACK, 0, 0, attempt, msg_id, 0);
        if (wal_write(seg, (int)wal_fd, entry, n) < 0) {
            int err = errno;
            unlock(seg);
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
    }
    __atomic_store_n((uint64_t *)a, (w & ~(uint64_t)0xFF) | ST_ACKED, __ATOMIC_RELEASE); /* commit */
    h[H_IN_FLIGHT] -= 1;
    CNT(seg)[C_ACKED_TOTAL] += 1;
    int post = freed_at(seg, base, cap, pos, head);
    unlock(seg);
    return PyLong_FromLong(post);
}


/* A stream partition's records as Arrow buffers: from position pos (of the record the
 * caller found, holding the partition's lock) up to tail, at most max_records, stopping at
 * a gap in the offsets. Returns (n, value offsets, values, key offsets, keys, key validity,
 * header offsets, headers, offsets, timestamps in us): int32 offsets, a validity bitmap,
 * int64 columns -- so a bulk reader (the Spark source) makes its columns without a Python
 * object per record. */
static PyObject *fast_read_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "read_columns(buffer, base, cap, pos, tail, max_records)");
        return NULL;
    }
    uint64_t base = PyLong_AsUnsignedLongLong(args[1]), cap = PyLong_AsUnsignedLongLong(args[2]);
    uint64_t pos = PyLong_AsUnsignedLongLong(args[3]), tail = PyLong_AsUnsignedLongLong(args[4]);
    Py_ssize_t max = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    if (cap < REC_SIZE || base + cap > (uint64_t)view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "read_columns: the ring is outside the buffer");
        return NULL;
    }
    const char *mem = (const char *)view.buf;
    Py_ssize_t n = 0;
    uint64_t vbytes = 0, kbytes = 0, hbytes = 0, prev = 0, p = pos;
    for (int pass = 0; pass < 2; pass++) {
        PyObject *out[9] = {NULL};
        char *vo = NULL, *vd = NULL, *ko = NULL, *kd = NULL, *kv = NULL, *ho = NULL, *hd = NULL, *of = NULL,
             *ts = NULL;
        if (pass == 1) {
            Py_ssize_t sizes[9] = {(n + 1) * 4, (Py_ssize_t)vbytes, (n + 1) * 4, (Py_ssize_t)kbytes, (n + 7) / 8,
                                   (n + 1) * 4, (Py_ssize_t)hbytes, n * 8, n * 8};
            for (int i = 0; i < 9; i++) {
                out[i] = PyBytes_FromStringAndSize(NULL, sizes[i]);
                if (!out[i]) {
                    for (int j = 0; j < i; j++) Py_DECREF(out[j]);
                    PyBuffer_Release(&view);
                    return NULL;
                }
            }
            vo = PyBytes_AS_STRING(out[0]); vd = PyBytes_AS_STRING(out[1]); ko = PyBytes_AS_STRING(out[2]);
            kd = PyBytes_AS_STRING(out[3]); kv = PyBytes_AS_STRING(out[4]); ho = PyBytes_AS_STRING(out[5]);
            hd = PyBytes_AS_STRING(out[6]); of = PyBytes_AS_STRING(out[7]); ts = PyBytes_AS_STRING(out[8]);
            memset(kv, 0, (n + 7) / 8);
            U32(vo) = U32(ko) = U32(ho) = 0;
        }
        Py_ssize_t want = pass == 0 ? max : n, i = 0;
        uint32_t vat = 0, kat = 0, hat = 0;
        p = pos;
        while (p < tail && i < want) {
            uint64_t rem = cap - p % cap;
            if (rem < REC_SIZE) { /* too little of the lap left for a record: the next lap */
                p += rem;
                continue;
            }
            const char *a = mem + base + p % cap;
            uint32_t length = U32(a + REC_LENGTH);
            if (length < REC_SIZE) break; /* never under the lock; stop rather than loop */
            if ((U64(a + REC_STATUS) & 0xFF) != ST_PAD) {
                uint64_t off = U64(a + REC_MSG_ID), klen = U64(a + REC_DEADLINE);
                uint32_t hl = U32(a + REC_HDR_LEN), bl = U32(a + REC_BODY_LEN);
                uint32_t kl = klen ? (uint32_t)(klen - 1) : 0;
                if (i > 0 && off != prev + 1) break; /* a gap: the next read is told of it */
                prev = off;
                if (pass == 0) {
                    vbytes += bl; kbytes += kl; hbytes += hl - kl;
                } else {
                    const char *b = a + REC_SIZE;
                    memcpy(kd + kat, b, kl);
                    memcpy(hd + hat, b + kl, hl - kl);
                    memcpy(vd + vat, b + hl, bl);
                    kat += kl; hat += hl - kl; vat += bl;
                    if (klen) kv[i >> 3] |= (char)(1 << (i & 7));
                    memcpy(ko + 4 * (i + 1), &kat, 4);
                    memcpy(ho + 4 * (i + 1), &hat, 4);
                    memcpy(vo + 4 * (i + 1), &vat, 4);
                    int64_t o = (int64_t)off, us = (int64_t)(U64(a + REC_ENQ_NS) / 1000);
                    memcpy(of + 8 * i, &o, 8);
                    memcpy(ts + 8 * i, &us, 8);
                }
                i++;
            }
            p += length;
        }
        if (pass == 0) {
            n = i;
            if (vbytes > INT32_MAX || kbytes > INT32_MAX || hbytes > INT32_MAX) {
                PyBuffer_Release(&view);
                PyErr_SetString(PyExc_ValueError, "read_columns: more than 2 GiB in one call: ask for fewer records");
                return NULL;
            }
        } else {
            PyBuffer_Release(&view);
            return Py_BuildValue("(nNNNNNNNNN)", n, out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7],
                                 out[8]);
        }
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE; /* not reached */
}

static PyMethodDef methods[] = {
    {"put", (PyCFunction)(void (*)(void))fast_put, METH_FASTCALL, "the put fast path"},
    {"take", (PyCFunction)(void (*)(void))fast_take, METH_FASTCALL, "the get fast path"},
    {"take_many", (PyCFunction)(void (*)(void))fast_take_many, METH_FASTCALL, "the get_many fast path"},
    {"ack", (PyCFunction)(void (*)(void))fast_ack, METH_FASTCALL, "the ack fast path"},
    {"ack_many", (PyCFunction)(void (*)(void))fast_ack_many, METH_FASTCALL, "the ack_many fast path"},
    {"read_columns", (PyCFunction)(void (*)(void))fast_read_columns, METH_FASTCALL,
     "a stream partition's records as Arrow buffers"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "shmq.engine._fast", "The engine's hot paths in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fast(void) {
    crc_init();
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "MUTEX_OFF", MUTEX_OFF) || PyModule_AddIntConstant(m, "HOT_OFF", HOT_W * 8) ||
        PyModule_AddIntConstant(m, "COUNTERS_OFF", COUNTERS_W * 8) ||
        PyModule_AddIntConstant(m, "REC_SIZE", REC_SIZE) || PyModule_AddIntConstant(m, "READY", ST_READY) ||
        PyModule_AddIntConstant(m, "LEASED", ST_LEASED) || PyModule_AddIntConstant(m, "ACKED", ST_ACKED) ||
        PyModule_AddIntConstant(m, "PAD", ST_PAD) || PyModule_AddIntConstant(m, "BUSY", R_BUSY) ||
        PyModule_AddIntConstant(m, "OWNERDEAD", R_OWNERDEAD) ||
        PyModule_AddIntConstant(m, "FALLBACK", R_FALLBACK) || PyModule_AddIntConstant(m, "EXPIRED", R_EXPIRED) ||
        PyModule_AddIntConstant(m, "DELETED", R_DELETED) ||
        PyModule_AddIntConstant(m, "WAL_MAX_PAYLOAD", WAL_MAX_PAYLOAD)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
