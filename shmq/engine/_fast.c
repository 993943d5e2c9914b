/* The engine's hot paths in C: put, get (the plain frontier take, building the Delivery itself:
 * DeliveryBase), ack; the consume loop's step (take_next: an ack and the next take under one
 * lock hold); the batch loops of put_many, get_many, ack_many and nack_many under one
 * lock hold; reserve / publish (a message filled in place, through a Loan); and a bulk read of
 * a stream partition into Arrow buffers (read_columns), and its mirror, a bulk append from
 * Arrow buffers (columns_check, columns_end, columns_log, write_columns).
 *
 * Strategy: these are the pure-Python fast paths of shmq/engine (Queue.put, _take_one,
 * _ack_one, _requeue, _append, _try_reserve / _publish) done with the same loads and stores in
 * the same order, on the same segment layout (shmq/engine/shm/layout.py, through the generated
 * _layout.h). They only ever take the uncontended case: anything else -- a busy lock, a dead
 * lock holder, a full ring, a requeued message, housekeeping due -- is handed back to the
 * Python code, which handles every case. The commit stores (the tail of a put, the status word of a take
 * or an ack) are release stores, so the compiler cannot move the record's writes after
 * them. The GIL stays held: nothing here blocks.
 */
#define _GNU_SOURCE /* gettid, pthread_mutex_clocklock */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <unistd.h>

#include "_layout.h" /* generated from layout.py; tests/test_layout.py fails while it is stale */
#include "_fast_api.h" /* these paths as C calls for the other extensions (the capsule _C_API) */

#define WAL_MAX_PAYLOAD 4096 /* larger entries take the Python path (zlib's faster CRC) */

/* results other than success: R_*, _layout.h's enum shmq_ret (layout.py's RETURNS) */

#define HOT(seg) ((uint64_t *)(seg) + HOT_W)
/* how far apart this segment's consecutive message ids are: its queue's lanes (0 or 1: one ring) */
#define ID_STEP(seg) (*(uint32_t *)((seg) + OPTS_LANES_OFF) ? *(uint32_t *)((seg) + OPTS_LANES_OFF) : 1)
#define CNT(seg) ((uint64_t *)(seg) + COUNTERS_W)
#define U64(p) (*(uint64_t *)(p))
/* a word of process slot ``slot``: its waiter counts and its share of the totals (P_ACKED, P_REDELIVERED) */
#define PROC_W(seg, slot, field) ((uint64_t *)(seg) + ((PROCS_OFF + (slot) * PROC_SIZE) >> 3) + (field))
#define U32(p) (*(uint32_t *)(p))

/* ---- memory (shm/memory.py): a queue's ring is allocated chunk by chunk, and a record is written
 * only where it is (a write to a hole that a full /dev/shm cannot fill is a SIGBUS). H_ROOM says how
 * far from the tail it is: a write that ends past it takes the Python path, which allocates first. */

/* A put into the empty queue whose tail is this far into its lap (layout.reuse_after), or past
 * POS_LIMIT, starts the next lap (produce._new_lap; start_lap where nothing is to allocate): the memory just freed. */
/* Bytes a record takes in the ring: its header, headers (a stream record's key and headers)
   and body, rounded up to 8; the one place C computes it (layout.record_size's twin). */
static inline uint64_t rec_size(uint64_t hl, uint64_t bl) {
    return (REC_SIZE + 7 + hl + bl) & ~(uint64_t)7;
}

static inline int new_lap_due(uint64_t head, uint64_t tail, uint64_t cap) {
    return head == tail && (tail % cap >= (cap / 4 < REUSE_MAX ? cap / 4 : REUSE_MAX) || tail >= POS_LIMIT);
}

/* A record of ``size`` bytes appended at ``end`` starts the next lap now (ring.early_wrap: past its window,
 * in the head's lap, a whole window free at the lap's start before the head): the Python append places it. */
static inline int early_wrap_due(uint64_t head, uint64_t end, uint64_t size, uint64_t cap) {
    if (size < LARGE) return 0;
    uint64_t w = WINDOW_RECORDS * size > WINDOW_MIN ? WINDOW_RECORDS * size : WINDOW_MIN;
    return 2 * w <= cap && end != head && end % cap >= w && head / cap == end / cap && w <= head % cap;
}

/* An early wrap's pad lies ahead of the head (layout.WRAP_OFF): a full ring may be a spill's to take, or
 * past the head's lap already (ring.fits): the Python append decides. */
#define WRAPPED(seg, head) (U64((seg) + WRAP_OFF) && U64((seg) + WRAP_OFF) >= (head))

/* ---- the lock. A busy lock is waited for here, never handed to Python (whose paths hold the
 * lock 3-10x longer, so the next caller would find it busy too: a convoy). First a short spin
 * that reads the lock word and only tries to take it when it looks free (a critical section here
 * lasts a few hundred nanoseconds), pausing the CPU between looks; then a sleep in the kernel
 * (the robust mutex's futex, through pthread_mutex_clocklock) with the GIL released, bounded by
 * LOCK_WAIT_NS: past it (a holder stopped by SIGSTOP or a debugger), R_BUSY hands the call to
 * the Python path, which waits until the call's own deadline and raises LockTimeout. */
#define LOCK_SPINS 256                   /* looks at the lock word before sleeping */
#define LOCK_WAIT_NS 100000000ULL        /* mutex.LOCK_GRACE_S: the shortest wait any call makes */
#define MUTEX_OWNER_OFF 8                /* glibc's pthread_mutex_t: int lock, unsigned count, int owner */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int lock_wait(pthread_mutex_t *m) {
    volatile int *word = (volatile int *)m;
    for (int i = 0; i < LOCK_SPINS; i++) {
        cpu_relax();
        if (__atomic_load_n(word, __ATOMIC_RELAXED) == 0) {
            int rc = pthread_mutex_trylock(m);
            if (rc != EBUSY) return rc;
        }
    }
    /* the holder may be this thread (a call inside its own reserve() block): Python says so */
    if (__atomic_load_n((int *)((char *)m + MUTEX_OWNER_OFF), __ATOMIC_RELAXED) == (int)gettid()) return EBUSY;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t until = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec + LOCK_WAIT_NS;
    ts.tv_sec = (time_t)(until / 1000000000ULL);
    ts.tv_nsec = (long)(until % 1000000000ULL);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &ts);
    Py_END_ALLOW_THREADS
    return rc;
}

/* 0 when locked; R_OWNERDEAD (locked: the caller repairs); R_BUSY after LOCK_WAIT_NS, or when
 * the lock cannot be had here (not recoverable, or held by this thread): the Python path. */
static inline int lock(char *seg) {
    pthread_mutex_t *m = (pthread_mutex_t *)(seg + MUTEX_OFF);
    int rc = pthread_mutex_trylock(m);
    if (rc == EBUSY) rc = lock_wait(m);
    if (rc == 0) return 0;
    return rc == EOWNERDEAD ? R_OWNERDEAD : R_BUSY;
}

static inline void unlock(char *seg) { pthread_mutex_unlock((pthread_mutex_t *)(seg + MUTEX_OFF)); }

/* Set while this thread makes data that it serves to its own waiters next (waits.serving: a
 * server's loop): sleepers that are all doorbells (H_BELLS) are then owed no post. */
static __thread int serving;

/* Posts owed to sleeping consumers now that ``n`` messages became ready (lock held): at
 * most one per waiter not yet posted; counted as posted here, made by the caller. */
static inline uint64_t owe_consumers(uint64_t *h, uint64_t n) {
    uint64_t cw = h[H_CWAIT], cp = h[H_CPOSTED];
    if (cw <= cp || !n) return 0;
    if (serving && cw <= h[H_BELLS]) return 0;
    uint64_t post = cw - cp < n ? cw - cp : n;
    h[H_CPOSTED] = cp + post;
    return post;
}

/* 1 if a sleeping producer is owed a post now that space was reclaimed (lock held). */
static inline int owe_producer(uint64_t *h) {
    uint64_t pw = h[H_PWAIT];
    if (pw && pw > h[H_PPOSTED]) {
        h[H_PPOSTED] += 1;
        return 1;
    }
    return 0;
}

/* ---- sleepers, as waits.register / waits.unregister count them (lock held): consumers in
 * cwait / cposted and their process slot's P_CWAIT, producers in pwait / pposted and P_PWAIT */
static inline void register_sleeper(char *seg, uint64_t slot, int wi, int field) {
    HOT(seg)[wi] += 1;
    *PROC_W(seg, slot, field) += 1;
}

static inline void unregister_sleeper(char *seg, uint64_t slot, int wi, int pi, int field, int waited) {
    uint64_t *h = HOT(seg), n = h[wi] - 1, posted = h[pi];
    h[wi] = n;
    *PROC_W(seg, slot, field) -= 1;
    if (waited == 2 && posted) posted -= 1;
    h[pi] = n ? posted : 0;
}

/* A call's wait argument (take's, put's): bit 0 asks to count the caller as a sleeper when there
 * is nothing to take, or no room (R_SLEEP), bits 1-2 say how the caller's last sleep ended
 * (waits.sleep_slice's 1 or 2: it is uncounted first thing under the lock); put's carries the
 * caller's process slot from bit 3 on (take has its own argument). Every result but R_BUSY and
 * R_OWNERDEAD took the lock, so the sleep was uncounted. */
#define W_REGISTER 1
/* put's wait: copy the body with the lock let go (a fill: layout.FILL_OFF), the record FILLING and held by
 * the caller's slot (bits 3+) meanwhile; the caller's handle is on an unlogged queue */
#define W_FILL (1ULL << 62)
#define FILL(seg) U64((seg) + FILL_OFF)
_Static_assert(sizeof(pthread_mutex_t) <= FILL_OFF - MUTEX_OFF, "the fill word must follow the mutex");

/* How far from ring position ``pos`` the ring's chunks are allocated without a gap, up to ``limit`` and the end
 * of ``pos``'s lap (memory.allocated_to: the bitmap, shm/memory.py, a word at a time). */
static uint64_t allocated_to(const char *seg, uint64_t base, uint64_t cap, uint64_t pos, uint64_t limit) {
    uint64_t lap = pos - pos % cap, a = base + pos - lap;
    uint64_t end = base + (limit < lap + cap ? limit : lap + cap) - lap;
    const uint64_t *bits = (const uint64_t *)seg + QMEM_BITMAP_W;
    uint64_t c = a >> CHUNK_SHIFT, stop = (end + (1ULL << CHUNK_SHIFT) - 1) >> CHUNK_SHIFT;
    while (c < stop) { /* the first chunk not allocated */
        uint64_t rest = ~bits[c >> 6] >> (c & 63);
        if (rest) {
            c += (uint64_t)__builtin_ctzll(rest);
            break;
        }
        c = (c | 63) + 1;
    }
    uint64_t at = c < stop ? c << CHUNK_SHIFT : end;
    return pos + (at > end ? end : at > a ? at : a) - a;
}

/* The empty queue due a new lap (new_lap_due; not past POS_LIMIT) starts it here as produce._room does
 * (_new_lap), where its first ``need`` bytes are allocated, so nothing is to allocate. Returns the new tail,
 * the cursors moved (the head first, as _new_lap) and the room set to the allocated run from it (ROOM_LOOK
 * past ``need`` at most; a put past it takes the Python path, which allocates and may grow ahead); 0, nothing
 * changed: the Python path. Lock held. */
static uint64_t start_lap(char *seg, uint64_t base, uint64_t cap, uint64_t need) {
    uint64_t *h = HOT(seg), tail = h[H_TAIL];
    if (tail >= POS_LIMIT || need > cap) return 0;
    uint64_t lap = tail + cap - tail % cap;
    uint64_t room = allocated_to(seg, base, cap, lap, lap + (need + ROOM_LOOK < cap ? need + ROOM_LOOK : cap));
    if (room < lap + need) return 0; /* memory to allocate first */
    FILL(seg) = 0;
    h[H_HEAD] = lap;
    h[H_FRONTIER] = h[H_READY_POS] = h[H_TAIL] = lap;
    h[H_ROOM] = room;
    return lap;
}

/* The room for a record of ``size`` bytes at ``pos`` that ends past it, set from the bitmap as produce._set_room
 * sets it (ROOM_LOOK past the record, within its lap), where the record's memory is allocated and no growth ahead
 * is due (else the Python path allocates, or grows ahead). 1 if the record fits the room now. Lock held. */
static int room_for(char *seg, uint64_t base, uint64_t cap, uint64_t head, uint64_t pos, uint64_t size) {
    uint64_t stop = pos + size, lap_end = pos - pos % cap + cap;
    uint64_t limit = stop + ROOM_LOOK < lap_end ? stop + ROOM_LOOK : lap_end;
    uint64_t room = allocated_to(seg, base, cap, pos, limit), ahead = (stop - head) >> 2;
    if (room < stop) return 0;
    if (room < limit && room < head + cap && room - stop < (ahead > (1ULL << CHUNK_SHIFT) ? ahead : 1ULL << CHUNK_SHIFT))
        return 0; /* growth ahead due: _set_room marks it */
    HOT(seg)[H_ROOM] = room;
    return 1;
}

/* Where a record of ``size`` bytes appended at ``end`` goes in the next lap, as produce._room places it: an early
 * wrap (``early``: early_wrap_due; the wrap word set to ``end``) or the lap's end (ring.place: ``size`` does not fit
 * before it), a PAD record from ``end`` to the lap's end (none where less than its header is left). Returns the
 * next lap's start, the room set from there (room_for); or 0, nothing changed, where memory is to allocate first
 * or the record does not fit now (a wait, a spill): the Python path. Lock held. */
static uint64_t next_lap(char *seg, uint64_t base, uint64_t cap, uint64_t head, uint64_t end, uint64_t size,
                         int early) {
    uint64_t rem = cap - end % cap, start = end + rem;
    if (!early && (start + size - head > cap - (WRAPPED(seg, head) ? REC_SIZE : 0) ||
                   allocated_to(seg, base, cap, end, start) < start)) /* (the pad's stretch allocated, as _room has it) */
        return 0;
    if (early && rem >= REC_SIZE && allocated_to(seg, base, cap, end, end + REC_SIZE) < end + REC_SIZE) return 0;
    if (!room_for(seg, base, cap, head, start, size)) return 0;
    if (rem >= REC_SIZE) {
        char *p = seg + base + end % cap;
        memset(p, 0, REC_SIZE);
        U32(p + REC_LENGTH) = (uint32_t)rem;
        U64(p + REC_STATUS) = ST_PAD;
    }
    if (early) U64(seg + WRAP_OFF) = end;
    return start;
}

/* The first record past ``tail`` is a fill whose holder may be dead (ring.suspect_fill: its process is gone,
 * or it was put longer than FILL_STALE_NS before ``now``, wall ns), which the Python append looks at. */
static int suspect_fill(char *seg, uint64_t base, uint64_t cap, uint64_t tail, uint64_t now) {
    uint64_t rem = cap - tail % cap;
    if (rem < REC_SIZE) tail += rem;
    char *a = seg + base + tail % cap;
    uint64_t s = U64(a);
    if ((s & 0xFF) != ST_FILLING) return 0;
    if (now > U64(a + REC_ENQ_NS) + FILL_STALE_NS) return 1;
    uint64_t pid = *PROC_W(seg, (s >> 8) & 0xFFFF, 0);
    int err = errno, gone = pid && pid < 1u << 31 && kill((pid_t)pid, 0) < 0 && errno == ESRCH;
    errno = err;
    return gone;
}

static int advance_head(char *seg, uint64_t base, uint64_t cap);

/* Move the tail over the records past it that are done (READY, or a PAD: abandoned) up to the first
 * one still FILLING, the fill word back to 0 once none is left (ring.commit_fills, lock held): how many
 * became ready (counted in ready; the caller owes their posts). */
static uint64_t commit_fills(char *seg, uint64_t base, uint64_t cap) {
    uint64_t *h = HOT(seg);
    uint64_t fill = FILL(seg), tail = h[H_TAIL], start = tail, n = 0;
    while (tail < fill) {
        uint64_t rem = cap - tail % cap;
        if (rem < REC_SIZE) { /* an implicit pad at the lap's end */
            tail += rem;
            continue;
        }
        char *a = seg + base + tail % cap;
        uint64_t st = U64(a) & 0xFF;
        if (st == ST_FILLING) break;
        n += st == ST_READY;
        tail += U32(a + REC_LENGTH);
    }
    if (tail != start) {
        __atomic_store_n(&h[H_TAIL], tail, __ATOMIC_RELEASE); /* commit */
        h[H_READY] += n;
        if (h[H_HEAD] == start) advance_head(seg, base, cap); /* (an empty queue: a PAD first is reclaimed now) */
    }
    if (fill && tail >= fill) FILL(seg) = 0;
    return n;
}

/* Publish the records written from the tail up to end, n of them ready: the tail stored first
 * (the commit), the next id, the ready count; returns the consumer posts owed (lock held). The
 * one commit of new records in C: ring.commit's twin (ring.py). */
static inline uint64_t commit(uint64_t *h, uint64_t end, uint64_t next_id, uint64_t n) {
    __atomic_store_n(&h[H_TAIL], end, __ATOMIC_RELEASE); /* commit */
    h[H_NEXT_ID] = next_id;
    h[H_READY] += n;
    return owe_consumers(h, n);
}

/* Commit one written record (lock held; released here): msg_id << 1 | 1 if a sleeping
 * consumer is owed a post, as put and publish return it. */
static uint64_t publish_one(char *seg, uint64_t tail, uint64_t msg_id) {
    uint64_t post = commit(HOT(seg), tail, msg_id + ID_STEP(seg), 1);
    unlock(seg);
    return msg_id << 1 | post;
}

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

/* Is the caller's descriptor for the current log generation, no fsync owed per entry, and no disk alarm on
 * (under it the Python path refuses what grows and logs what settles)? */
static inline int wal_usable(char *seg, uint64_t gen) {
    uint64_t *w = (uint64_t *)seg;
    uint64_t mode = w[WALCFG_W + 1] & 0xFFFFFFFFu;
    return gen && w[WALCFG_W] == gen && mode != WAL_ALWAYS && !(mode & WAL_ALARM);
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

/* The put (fast_put's work, the body and headers as pointers): msg_id << 1 | 1 if a consumer
 * must be woken, or R_*; R_OSERROR with errno set when the log's write failed. */
static int64_t put_core(char *seg, uint64_t base, uint64_t cap, const char *body, uint64_t bl, const char *hraw,
                        uint64_t hl, uint64_t enq, long wal_fd, uint64_t wal_gen, uint64_t wait, uint64_t *unfinished,
                        uint64_t *posts) {
    uint64_t size = rec_size(hl, bl);
    unsigned char *entry = NULL;
    if (wal_fd >= 0) {
        if (hl + bl > WAL_MAX_PAYLOAD) return R_FALLBACK;
        entry = PyMem_Malloc(LOG_HEAD + hl + bl + 4);
        if (!entry) return R_FALLBACK; /* (the Python path raises the MemoryError) */
        memcpy(entry + LOG_HEAD, hraw, hl);
        memcpy(entry + LOG_HEAD + hl, body, bl);
    }

    int rc = lock(seg);
    if (rc) {
        PyMem_Free(entry);
        return rc;
    }
    uint64_t *h = HOT(seg), slot = (wait & ~W_FILL) >> 3;
    if (wait >> 1 & 3) unregister_sleeper(seg, slot, H_PWAIT, H_PPOSTED, P_PWAIT, (int)(wait >> 1 & 3));
    uint64_t tail = h[H_TAIL], fill = FILL(seg), end = fill > tail ? fill : tail, off = end % cap;
    if (!entry && end == tail && !h[H_DELETED] && new_lap_due(h[H_HEAD], tail, cap) &&
        (tail = start_lap(seg, base, cap, size)) != 0) {
        end = tail; /* the memory just freed, at the ring's start */
        off = 0;
    } else {
        tail = h[H_TAIL];
    }
    if (h[H_DELETED] || (entry && (size > cap - off || end != tail || !wal_usable(seg, wal_gen))) ||
        (end != tail && suspect_fill(seg, base, cap, tail, enq))) {
        unlock(seg); /* a pad to place first, a log (not past fills, nor one the caller's descriptor is not for), a
                      * fill whose holder may be dead */
        PyMem_Free(entry);
        return R_FALLBACK;
    }
    uint64_t head = h[H_HEAD];
    int wrapped = WRAPPED(seg, head);
    if (end + size - head > cap && !wrapped) { /* no room now: the caller waits for some (R_FULL, R_SLEEP) */
        if (wait & W_REGISTER) register_sleeper(seg, slot, H_PWAIT, P_PWAIT);
        unlock(seg);
        PyMem_Free(entry);
        return wait & W_REGISTER ? R_SLEEP : R_FULL;
    }
    int early = early_wrap_due(head, end, size, cap);
    if (!entry && end != head && (early || size > cap - off)) { /* the next lap (a logged queue's: the Python put) */
        if (!(end = next_lap(seg, base, cap, head, end, size, early))) {
            unlock(seg); /* memory to allocate first, or a wait or spill: the Python put */
            return R_FALLBACK;
        }
        off = 0; /* past the pad (committed with the record: commit_fills passes it) */
    } else if (size > cap - off || end + size - head > cap - (wrapped ? REC_SIZE : 0) ||
               (end == tail && new_lap_due(head, tail, cap)) || early ||
               (end + size > h[H_ROOM] && !room_for(seg, base, cap, head, end, size))) {
        unlock(seg); /* a new lap, a logged wrap or a spill, or memory to allocate first: the Python put */
        PyMem_Free(entry);
        return R_FALLBACK;
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
            return R_OSERROR;
        }
        PyMem_Free(entry);
    }
    int filling = (wait & W_FILL) && !entry;
    U64(a + REC_STATUS) = filling ? ST_FILLING | slot << 8 : ST_READY;
    U32(a + REC_LENGTH) = (uint32_t)size;
    U32(a + REC_BODY_LEN) = (uint32_t)bl;
    U32(a + REC_HDR_LEN) = (uint32_t)hl;
    U32(a + REC_FLAGS) = 0;
    U64(a + REC_MSG_ID) = msg_id;
    U64(a + REC_ENQ_NS) = enq;
    U64(a + REC_DEADLINE) = 0;
    if (hl) memcpy(a + REC_SIZE, hraw, hl);
    if (!filling && end == tail) { /* the plain put: written and committed under one hold */
        memcpy(a + REC_SIZE + hl, body, bl);
        return (int64_t)publish_one(seg, tail + size, msg_id);
    }
    h[H_NEXT_ID] = msg_id + ID_STEP(seg);
    FILL(seg) = end + size; /* placed: past the tail, after the fills before it */
    if (filling) { /* the body copied with the lock (and the GIL) let go, then the record done, the tail moved on */
        unlock(seg);
        Py_BEGIN_ALLOW_THREADS
        memcpy(a + REC_SIZE + hl, body, bl);
        Py_END_ALLOW_THREADS
        if ((rc = lock(seg))) { /* busy, or taken from a dead holder (held then): Python waits or repairs, then ends it */
            *unfinished = end << 1 | (rc == R_OWNERDEAD);
            return R_UNFINISHED;
        }
        __atomic_store_n((uint64_t *)a, ST_READY, __ATOMIC_RELEASE);
    } else { /* after fills not yet done: written whole, seen once they are */
        memcpy(a + REC_SIZE + hl, body, bl);
    }
    uint64_t done = commit_fills(seg, base, cap);
    /* a fill's end may make many records ready: as many posts as sleepers (``posts``: the caller makes
     * them); else one at most, the bit of the result (the records after a fill still under way are
     * committed by its end, so none is done here but after a dead holder's repair) */
    uint64_t post = owe_consumers(h, filling ? done : done < 1 ? done : 1);
    unlock(seg);
    *posts = post;
    return (int64_t)(msg_id << 1 | (post ? 1 : 0));
}

/* Make ``n`` posts to a queue's not-empty semaphore ``sem`` (a Sem, or the Python one): 0, or -1
 * with an exception set. */
static int post_sem(PyObject *sem, uint64_t n) {
    for (; n; n--) {
        PyObject *r = PyObject_CallMethod(sem, "release", NULL);
        if (!r) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* put(seg, base, cap, body, hraw, enq_ns, wal_fd, wal_gen[, wait[, mapping, not_empty]])
 *   -> msg_id << 1 | (1 if a consumer must be woken), or R_*: R_FULL when there is no room
 *   now (R_SLEEP: and the caller counted as a producer waiting for room; ``wait``: W_REGISTER);
 *   with W_FILL in ``wait`` (and the queue's mapping, held while the fill copies, and its not-empty
 *   semaphore, posted here for every consumer the fill's end wakes: msg_id << 1 then), (position << 1 | 1
 *   if the lock is held, taken from a dead holder,) when the copied fill's lock was not had at once
 *   (Python ends the fill)
 * wal_fd < 0: no log; else the PUT entry is appended to it before the commit */
static PyObject *fast_put(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[3], enq, wait = 0;
    if (nargs != 8 && nargs != 9 && nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "put takes 8, 9 or 11 arguments");
        return NULL;
    }
    if (nargs >= 9 && parse_u64s(args + 8, 1, &wait) < 0) return NULL;
    if ((wait & W_FILL) && nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "a fill's put takes the mapping and the not-empty semaphore last");
        return NULL;
    }
    long wal_fd = PyLong_AsLong(args[6]);
    if (wal_fd == -1 && PyErr_Occurred()) return NULL;
    uint64_t wal_gen = PyLong_AsUnsignedLongLong(args[7]);
    if (wal_gen == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    if (parse_u64s(args, 3, v) < 0) return NULL;
    if (!PyBytes_CheckExact(args[4])) return PyLong_FromLong(R_FALLBACK);
    enq = PyLong_AsUnsignedLongLong(args[5]);
    if (enq == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    Py_buffer body = {0}; /* a body of bytes, or any one-piece buffer (a numpy array's memory): copied once, here */
    if (PyBytes_CheckExact(args[3])) {
        body.buf = PyBytes_AS_STRING(args[3]);
        body.len = PyBytes_GET_SIZE(args[3]);
    } else if (PyObject_GetBuffer(args[3], &body, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return PyLong_FromLong(R_FALLBACK);
    }
    Py_buffer mapping = {0}; /* a fill holds the mapping while it copies without the GIL (a close waits for it) */
    if ((wait & W_FILL) && PyObject_GetBuffer(args[9], &mapping, PyBUF_SIMPLE) < 0) {
        if (body.obj) PyBuffer_Release(&body);
        return NULL;
    }
    uint64_t unfinished = 0, posts = 0;
    int64_t r = put_core((char *)(uintptr_t)v[0], v[1], v[2], body.buf, (uint64_t)body.len,
                         PyBytes_AS_STRING(args[4]), (uint64_t)PyBytes_GET_SIZE(args[4]), enq, wal_fd, wal_gen, wait,
                         &unfinished, &posts);
    int err = errno;
    if (mapping.obj) PyBuffer_Release(&mapping);
    if (body.obj) PyBuffer_Release(&body);
    errno = err;
    if (r == R_OSERROR) return PyErr_SetFromErrno(PyExc_OSError);
    if (r == R_UNFINISHED) return Py_BuildValue("(K)", (unsigned long long)unfinished);
    if (r >= 0 && (wait & W_FILL)) { /* (the message is in: a failed post raises, as the Python put's would) */
        if (post_sem(args[10], posts) < 0) return NULL;
        r &= ~(int64_t)1;
    }
    return r < 0 ? PyLong_FromLong((long)r) : PyLong_FromUnsignedLongLong((uint64_t)r);
}

/* ---- deliveries: DeliveryBase holds a delivery's fields (the Python Delivery subclasses it
 * with its methods and properties), so a take builds the object itself: no tuple, no Python
 * __init__. Its members are the slots the pure-Python twin has (delivery.py); unset ones raise
 * AttributeError, as unset slots do, except _ext and _raw, which read None until set. */
typedef ShmqDeliveryFields DeliveryBase; /* (_fast_api.h: the other extensions read its fields too) */

static PyTypeObject *delivery_class; /* the Python Delivery (set_delivery_class), a subclass */

static PyMemberDef dlv_members[] = {
    {"id", T_OBJECT_EX, offsetof(DeliveryBase, id), 0, NULL},
    {"body", T_OBJECT_EX, offsetof(DeliveryBase, body), 0, NULL},
    {"attempt", T_OBJECT_EX, offsetof(DeliveryBase, attempt), 0, NULL},
    {"_q", T_OBJECT_EX, offsetof(DeliveryBase, q), 0, NULL},
    {"_pos", T_OBJECT_EX, offsetof(DeliveryBase, pos), 0, NULL},
    {"_hraw", T_OBJECT_EX, offsetof(DeliveryBase, hraw), 0, NULL},
    {"_enq", T_OBJECT_EX, offsetof(DeliveryBase, enq), 0, NULL},
    {"_ext", T_OBJECT, offsetof(DeliveryBase, ext), 0, NULL}, /* None until the header bytes are split */
    {"_raw", T_OBJECT, offsetof(DeliveryBase, raw), 0, NULL}, /* None unless a serializer loaded the body */
    {NULL},
};

static int dlv_traverse(DeliveryBase *d, visitproc visit, void *arg) {
    Py_VISIT(d->id);
    Py_VISIT(d->body);
    Py_VISIT(d->attempt);
    Py_VISIT(d->q);
    Py_VISIT(d->pos);
    Py_VISIT(d->hraw);
    Py_VISIT(d->enq);
    Py_VISIT(d->ext);
    Py_VISIT(d->raw);
    return 0;
}

static int dlv_clear(DeliveryBase *d) {
    Py_CLEAR(d->id);
    Py_CLEAR(d->body);
    Py_CLEAR(d->attempt);
    Py_CLEAR(d->q);
    Py_CLEAR(d->pos);
    Py_CLEAR(d->hraw);
    Py_CLEAR(d->enq);
    Py_CLEAR(d->ext);
    Py_CLEAR(d->raw);
    return 0;
}

static void dlv_dealloc(DeliveryBase *d) {
    PyObject_GC_UnTrack(d);
    dlv_clear(d);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

/* Delivery(q, pos, msg_id, attempt, body, hraw, enq_ns=0): the Python paths' constructor */
static int dlv_init(DeliveryBase *d, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"q", "pos", "msg_id", "attempt", "body", "hraw", "enq_ns", NULL};
    PyObject *q, *pos, *id, *attempt, *body, *hraw, *enq = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|O", kwlist, &q, &pos, &id, &attempt, &body, &hraw, &enq))
        return -1;
    if (!enq) enq = PyLong_FromLong(0);
    else Py_INCREF(enq);
    if (!enq) return -1;
    Py_INCREF(q);
    Py_INCREF(pos);
    Py_INCREF(id);
    Py_INCREF(attempt);
    Py_INCREF(body);
    Py_INCREF(hraw);
    Py_XSETREF(d->q, q);
    Py_XSETREF(d->pos, pos);
    Py_XSETREF(d->id, id);
    Py_XSETREF(d->attempt, attempt);
    Py_XSETREF(d->body, body);
    Py_XSETREF(d->hraw, hraw);
    Py_XSETREF(d->enq, enq);
    return 0;
}

static PyTypeObject DeliveryBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmq.engine._fast.DeliveryBase",
    .tp_basicsize = sizeof(DeliveryBase),
    .tp_dealloc = (destructor)dlv_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A delivery's fields; shmq.engine.queues.delivery.Delivery adds its methods",
    .tp_traverse = (traverseproc)dlv_traverse,
    .tp_clear = (inquiry)dlv_clear,
    .tp_members = dlv_members,
    .tp_init = (initproc)dlv_init,
    .tp_new = PyType_GenericNew,
};

/* Whether a subclass of DeliveryBase adds storage of its own: slots (a larger basic size), or a
 * __dict__ or __weakref__, which Python 3.12 keeps outside the basic size ("managed": flags, not
 * offsets, say so), so the size alone no longer tells. */
static int adds_fields(PyTypeObject *t) {
    if (t->tp_basicsize != DeliveryBaseType.tp_basicsize || t->tp_dictoffset || t->tp_weaklistoffset) return 1;
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (PyType_HasFeature(t, Py_TPFLAGS_MANAGED_DICT)) return 1;
#endif
#ifdef Py_TPFLAGS_MANAGED_WEAKREF
    if (PyType_HasFeature(t, Py_TPFLAGS_MANAGED_WEAKREF)) return 1;
#endif
    return 0;
}

/* set_delivery_class(cls): the class takes build (a subclass of DeliveryBase adding no fields) */
static PyObject *fast_set_delivery_class(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &DeliveryBaseType) ||
        adds_fields((PyTypeObject *)cls)) {
        PyErr_SetString(PyExc_TypeError, "set_delivery_class: a subclass of DeliveryBase with __slots__ = ()");
        return NULL;
    }
    Py_INCREF(cls);
    Py_XSETREF(delivery_class, (PyTypeObject *)cls);
    Py_RETURN_NONE;
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

/* A Delivery of the record at ``a`` (ring offset ``off``, position ``pos``), to be taken with
 * ``attempt``: built before the take's commit, so a MemoryError changes nothing. */
static PyObject *delivery_of(PyObject *q, char *a, uint64_t off, uint64_t pos, uint64_t attempt, int mode,
                             PyObject *ring) {
    uint64_t bl = U32(a + REC_BODY_LEN), hl = U32(a + REC_HDR_LEN);
    DeliveryBase *d = (DeliveryBase *)delivery_class->tp_alloc(delivery_class, 0);
    if (!d) return NULL;
    Py_INCREF(q);
    d->q = q;
    d->body = body_of(a, off, hl, bl, mode, ring);
    if (hl) {
        d->hraw = PyBytes_FromStringAndSize(a + REC_SIZE, (Py_ssize_t)hl);
    } else {
        Py_INCREF(Py_None);
        d->hraw = Py_None;
    }
    d->pos = PyLong_FromUnsignedLongLong(pos);
    d->id = PyLong_FromUnsignedLongLong(U64(a + REC_MSG_ID));
    d->attempt = PyLong_FromUnsignedLongLong(attempt);
    d->enq = PyLong_FromUnsignedLongLong(U64(a + REC_ENQ_NS));
    if (!d->body || !d->hraw || !d->pos || !d->id || !d->attempt || !d->enq) {
        Py_DECREF(d);
        return NULL;
    }
    return (PyObject *)d;
}

/* The producer post owed after space was freed at ``pos`` (lock held): 1 or 0. */
static int freed_at(char *seg, uint64_t base, uint64_t cap, uint64_t pos, uint64_t head);
static int advance_head(char *seg, uint64_t base, uint64_t cap);

/* The lock, the sleep undone, and the plain-FIFO checks of both takes: 0 with the lock held and
 * a ready record at the frontier; else R_* with the lock released: R_EMPTY (nothing ready and
 * nothing due: the caller may spin or sleep) or R_SLEEP (the same, counted as a sleeper),
 * R_FALLBACK (the general take's case), R_BUSY / R_OWNERDEAD (lock not taken / held). */
static inline int take_checks(char *seg, uint64_t slot, uint64_t now, int wait);

static int take_prologue(char *seg, uint64_t slot, uint64_t now, int wait) {
    int rc = lock(seg);
    if (rc) return rc;
    if (wait >> 1) unregister_sleeper(seg, slot, H_CWAIT, H_CPOSTED, P_CWAIT, wait >> 1);
    return take_checks(seg, slot, now, wait);
}

/* take_prologue's checks once the lock is held (and the sleep undone); a queue that expires is
 * used now (``lifetime.used``: its last-used word stored once it is a quarter of expires old) */
static inline int take_checks(char *seg, uint64_t slot, uint64_t now, int wait) {
    uint64_t *h = HOT(seg), *w = (uint64_t *)seg;
    if (h[H_REQUEUED] || h[H_DELETED] || now >= h[H_NEXT_DEADLINE] || now >= h[H_NEXT_LIVENESS] ||
        w[SPECIAL_W]) { /* requeued or special records, housekeeping due: the general take */
        unlock(seg);
        return R_FALLBACK;
    }
    uint64_t stale = w[LIFETIME_W] >> LIFE_EXPIRES_SHIFT; /* expires, ms (0: never) */
    if (stale) { /* as layout.life_renew_ns */
        stale = stale * 250000 < LIFE_RENEW_NS ? stale * 250000 : LIFE_RENEW_NS;
        if (now - w[LAST_USED_W] >= stale) w[LAST_USED_W] = now;
    }
    if (h[H_FRONTIER] >= h[H_TAIL]) {
        if (wait & W_REGISTER) register_sleeper(seg, slot, H_CWAIT, P_CWAIT);
        unlock(seg);
        return wait & W_REGISTER ? R_SLEEP : R_EMPTY;
    }
    return 0;
}

static inline PyObject *take_locked(PyObject *q, char *seg, uint64_t base, uint64_t cap, uint64_t slot,
                                    uint64_t vis_ns, uint64_t maxdel, uint64_t now, int mode, PyObject *ring);

/* take(q, seg, base, cap, slot, vis_ns, max_deliveries or 0, now[, mode, ring[, wait]])
 *   -> a Delivery of ``q``, or R_*; a record with flags (a priority level or an extension
 *   block) is left to the general take. ``now`` is the caller's monotonic clock in ns, so the
 *   Python and C paths share one clock. mode M_AUTOACK: the record is settled (ACKED) as it is
 *   taken, and (delivery, 1) says a producer must be woken; M_VIEW: the body is a slice of
 *   ``ring``. ``wait``: see W_REGISTER. A leased record's Delivery is built after the unlock
 *   (its bytes are the holder's until it settles them); an auto-acked one's before the commit
 *   (its space may be reused at once). */
static PyObject *fast_take(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[9] = {0};
    if ((nargs != 8 && nargs != 10 && nargs != 11) || !delivery_class) {
        PyErr_SetString(PyExc_TypeError, "take takes 8, 10 or 11 arguments (and a delivery class set)");
        return NULL;
    }
    if (parse_u64s(args + 1, 7, v) < 0 || (nargs >= 10 && parse_u64s(args + 8, 1, v + 7) < 0) ||
        (nargs == 11 && parse_u64s(args + 10, 1, v + 8) < 0))
        return NULL;
    PyObject *q = args[0], *ring = nargs >= 10 ? args[9] : NULL;
    char *seg = (char *)(uintptr_t)v[0];
    uint64_t base = v[1], cap = v[2], slot = v[3], vis_ns = v[4], maxdel = v[5], now = v[6];
    int mode = (int)v[7];

    int rc = take_prologue(seg, slot, now, (int)v[8]);
    if (rc) return PyLong_FromLong(rc);
    return take_locked(q, seg, base, cap, slot, vis_ns, maxdel, now, mode, ring);
}

/* take's work once take_prologue found a ready record at the frontier (lock held; released
 * here): a Delivery, (Delivery, 1) when auto-acked and a producer is owed a post, or R_*. */
static inline PyObject *take_locked(PyObject *q, char *seg, uint64_t base, uint64_t cap, uint64_t slot,
                                    uint64_t vis_ns, uint64_t maxdel, uint64_t now, int mode, PyObject *ring) {
    uint64_t *h = HOT(seg);
    uint64_t pos = h[H_FRONTIER], tail = h[H_TAIL], next_deadline = h[H_NEXT_DEADLINE];
    while (pos < tail) { /* pads at the frontier (a lap's end, an early wrap's) are passed over, as take_many does */
        uint64_t o = pos % cap;
        if (cap - o < REC_SIZE) {
            pos += cap - o;
            continue;
        }
        if ((U64(seg + base + o) & 0xFF) != ST_PAD) break;
        pos += U32(seg + base + o + REC_LENGTH);
    }
    if (pos >= tail) {
        unlock(seg);
        return PyLong_FromLong(R_FALLBACK);
    }
    uint64_t off = pos % cap;
    char *a = seg + base + off;
    uint64_t status = U64(a), attempt = (status >> 32) + 1;
    if ((status & 0xFF) != ST_READY || (maxdel && attempt > maxdel) || U32(a + REC_FLAGS)) {
        unlock(seg); /* an implicit pad, a pad, a priority level or an extension block: the general take */
        return PyLong_FromLong(R_FALLBACK);
    }
    uint64_t length = U32(a + REC_LENGTH);
    if (mode & M_AUTOACK) {
        PyObject *d = delivery_of(q, a, off, pos, attempt, mode, ring); /* first: on a MemoryError nothing changed */
        if (!d) {
            unlock(seg);
            return NULL;
        }
        uint64_t head = h[H_HEAD];
        __atomic_store_n((uint64_t *)a, ST_ACKED | (slot << 8) | (attempt << 32), __ATOMIC_RELEASE); /* commit */
        h[H_FRONTIER] = pos + length;
        h[H_READY] -= 1;
        *PROC_W(seg, slot, P_ACKED) += 1;
        if (attempt > 1) *PROC_W(seg, slot, P_REDELIVERED) += 1;
        int post = freed_at(seg, base, cap, pos, head);
        unlock(seg);
        if (post) return Py_BuildValue("(Ni)", d, 1);
        return d;
    }
    uint64_t until = now + vis_ns;
    U64(a + REC_DEADLINE) = until;
    __atomic_store_n((uint64_t *)a, ST_LEASED | (slot << 8) | (attempt << 32), __ATOMIC_RELEASE); /* commit */
    h[H_FRONTIER] = pos + length;
    h[H_READY] -= 1;
    h[H_IN_FLIGHT] += 1;
    if (until < next_deadline) h[H_NEXT_DEADLINE] = until;
    if (attempt > 1) *PROC_W(seg, slot, P_REDELIVERED) += 1;
    unlock(seg);
    /* leased to us: on a MemoryError here it is delivered again when the lease lapses */
    return delivery_of(q, a, off, pos, attempt, mode, ring);
}

/* take_many(q, seg, base, cap, slot, vis_ns, max_deliveries or 0, now, max_messages, max_bytes or 0, mode, ring
 *           [, wait])
 *   -> [Delivery, ...] (at least one), or R_*: the plain take repeated under one lock hold,
 *   from the frontier on, stopping at the first record it leaves to Python (requeued or
 *   special records, a due deadline, flags, an attempt past max_deliveries, the byte budget:
 *   the first message is always taken). mode and wait as take's; with M_AUTOACK: ([...], 1 if a
 *   producer must be woken). Leased records become Deliveries after the unlock (their bytes
 *   are ours until settled), auto-acked ones before their commit. */
static PyObject *take_many_core(PyObject *q, char *seg, uint64_t base, uint64_t cap, uint64_t slot,
                                uint64_t vis_ns, uint64_t maxdel, uint64_t now, uint64_t maxn, uint64_t budget,
                                int mode, PyObject *ring, int wait);

static PyObject *fast_take_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[11] = {0};
    if ((nargs != 12 && nargs != 13) || !delivery_class) {
        PyErr_SetString(PyExc_TypeError, "take_many takes 12 or 13 arguments (and a delivery class set)");
        return NULL;
    }
    if (parse_u64s(args + 1, 10, v) < 0 || (nargs == 13 && parse_u64s(args + 12, 1, v + 10) < 0)) return NULL;
    return take_many_core(args[0], (char *)(uintptr_t)v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8],
                          (int)v[9], args[11], (int)v[10]);
}

/* take_many's work (the arguments as C values; ``ring`` may be NULL without M_VIEW) */
static PyObject *take_many_core(PyObject *q, char *seg, uint64_t base, uint64_t cap, uint64_t slot,
                                uint64_t vis_ns, uint64_t maxdel, uint64_t now, uint64_t maxn, uint64_t budget,
                                int mode, PyObject *ring, int wait) {
    if (maxn < 1) maxn = 1;
    int autoack = mode & M_AUTOACK;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    uint64_t *taken_at = NULL; /* (ring offset, position, attempt) of each record leased, for after the unlock */
    if (!autoack) {
        taken_at = PyMem_Malloc(sizeof(uint64_t) * 3 * (size_t)(maxn < 4096 ? maxn : 4096));
        if (!taken_at) {
            Py_DECREF(out);
            return PyErr_NoMemory();
        }
        if (maxn > 4096) maxn = 4096;
    }
    int rc = take_prologue(seg, slot, now, wait);
    if (rc) {
        Py_DECREF(out);
        PyMem_Free(taken_at);
        return PyLong_FromLong(rc);
    }
    uint64_t *h = HOT(seg);
    uint64_t pos = h[H_FRONTIER], tail = h[H_TAIL], next_deadline = h[H_NEXT_DEADLINE], head = h[H_HEAD];
    uint64_t until = now + vis_ns, taken = 0, redelivered = 0, first = 0;
    uint64_t settled = autoack ? ST_ACKED : ST_LEASED;
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
        if (autoack) { /* built first: its space may be reused once it is settled */
            PyObject *d = delivery_of(q, a, off, pos, attempt, mode, ring);
            if (!d || PyList_Append(out, d) < 0) {
                Py_XDECREF(d);
                if (!taken) { /* nothing changed */
                    unlock(seg);
                    Py_DECREF(out);
                    return NULL;
                }
                PyErr_Clear(); /* the ones taken are settled: hand them out */
                break;
            }
            Py_DECREF(d);
        } else {
            taken_at[3 * taken] = off;
            taken_at[3 * taken + 1] = pos;
            taken_at[3 * taken + 2] = attempt;
            U64(a + REC_DEADLINE) = until;
        }
        if (!taken) first = pos;
        __atomic_store_n((uint64_t *)a, settled | (slot << 8) | (attempt << 32), __ATOMIC_RELEASE); /* commit */
        pos += length;
        taken++;
        if (attempt > 1) redelivered++;
    }
    int post = 0;
    if (taken) {
        h[H_FRONTIER] = pos;
        h[H_READY] -= taken;
        if (autoack) {
            *PROC_W(seg, slot, P_ACKED) += taken;
            post = freed_at(seg, base, cap, first, head);
        } else {
            h[H_IN_FLIGHT] += taken;
            if (until < next_deadline) h[H_NEXT_DEADLINE] = until;
        }
        if (redelivered) *PROC_W(seg, slot, P_REDELIVERED) += redelivered;
    }
    unlock(seg);
    if (!taken) { /* the first record is not a plain one */
        Py_DECREF(out);
        PyMem_Free(taken_at);
        return PyLong_FromLong(R_FALLBACK);
    }
    if (autoack) return Py_BuildValue("(Ni)", out, post);
    /* leased to us: on a MemoryError the rest are delivered again when their leases lapse */
    for (uint64_t i = 0; i < taken; i++) {
        uint64_t off = taken_at[3 * i];
        PyObject *d = delivery_of(q, seg + base + off, off, taken_at[3 * i + 1], taken_at[3 * i + 2], mode, ring);
        if (!d || PyList_Append(out, d) < 0) {
            Py_XDECREF(d);
            PyMem_Free(taken_at);
            if (PyList_GET_SIZE(out)) {
                PyErr_Clear();
                return out;
            }
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(d);
    }
    PyMem_Free(taken_at);
    return out;
}

/* The arguments of ack_many and nack_many: (seg, base, cap, [pos, attempt, msg_id, ...], now, slot):
 * ``v`` gets seg, base, cap and slot (the caller's process slot, whose share of the totals an
 * ack counts in). The triples, read before the lock (nothing fails under it), in a new array
 * of 3 * ``k``; NULL with an exception set. */
static uint64_t *settle_args(PyObject *const *args, Py_ssize_t nargs, const char *name, uint64_t *v, uint64_t *now,
                             Py_ssize_t *k) {
    if (nargs != 6 || !PyList_CheckExact(args[3])) {
        PyErr_Format(PyExc_TypeError, "%s takes 6 arguments, the fourth a list", name);
        return NULL;
    }
    if (parse_u64s(args, 3, v) < 0 || parse_u64s(args + 4, 1, now) < 0 || parse_u64s(args + 5, 1, v + 3) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(args[3]);
    if (n % 3) {
        PyErr_Format(PyExc_ValueError, "%s: (pos, attempt, msg_id) triples", name);
        return NULL;
    }
    uint64_t *d = PyMem_Malloc(sizeof(uint64_t) * (size_t)(n ? n : 1));
    if (!d) {
        PyErr_NoMemory();
        return NULL;
    }
    if (parse_u64s(PySequence_Fast_ITEMS(args[3]), n, d) < 0) {
        PyMem_Free(d);
        return NULL;
    }
    *k = n / 3;
    return d;
}

/* ack_many(seg, base, cap, [pos, attempt, msg_id, ...], now, slot)
 *   -> (acked, 1 if a producer must be woken else 0, [indices of those no longer leased]), or R_*:
 *   the plain ack repeated under one lock hold, for a queue with no log (the Python path logs) */
static int ack_many_core(char *seg, uint64_t base, uint64_t cap, const uint64_t *d, Py_ssize_t k, uint64_t now,
                         uint64_t slot, uint64_t *acked, int *post_out, Py_ssize_t *bad, Py_ssize_t *nbad_out) {
    int rc = lock(seg);
    if (rc) return rc;
    uint64_t *h = HOT(seg);
    if (h[H_DELETED]) {
        unlock(seg);
        return R_DELETED;
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
    *PROC_W(seg, slot, P_ACKED) += done;
    int post = 0;
    if (freed && advance_head(seg, base, cap)) {
        post = owe_producer(h);
    }
    unlock(seg);
    *acked = done;
    *post_out = post;
    *nbad_out = nbad;
    return 0;
}

static PyObject *fast_ack_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[4], now, done;
    Py_ssize_t k, nbad;
    int post;
    uint64_t *d = settle_args(args, nargs, "ack_many", v, &now, &k);
    if (!d) return NULL;
    Py_ssize_t *bad = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(k ? k : 1));
    if (!bad) {
        PyMem_Free(d);
        return PyErr_NoMemory();
    }
    int rc = ack_many_core((char *)(uintptr_t)v[0], v[1], v[2], d, k, now, v[3], &done, &post, bad, &nbad);
    PyMem_Free(d);
    if (rc) {
        PyMem_Free(bad);
        return PyLong_FromLong(rc);
    }
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

/* Where a record of ``size`` bytes appended at ``pos`` starts (ring.place): at ``pos``, or, when
 * too little of the lap is left, at the next lap's start, the rest of this one a pad (a PAD
 * record, or nothing under a record header's size). */
static uint64_t placed(char *seg, uint64_t base, uint64_t cap, uint64_t pos, uint64_t size) {
    uint64_t rem = cap - pos % cap;
    if (size <= rem) return pos;
    if (rem >= REC_SIZE) {
        char *p = seg + base + pos % cap;
        memset(p, 0, REC_SIZE);
        U64(p + REC_STATUS) = ST_PAD;
        U32(p + REC_LENGTH) = (uint32_t)rem;
    }
    return pos + rem;
}

/* put_many(seg, base, cap, bodies, hraws, max_message_bytes, enq_ns[, wait])
 *   -> (first msg_id, consumer posts owed), or R_*: a batch appended under one lock hold, all
 *   or nothing, placed as the Python append places it (a record that does not fit before the
 *   end of the ring starts the next lap, after a PAD record). ``hraws``: bytes, the encoded
 *   headers of every item (b"": none), or a list of bytes, one per body. R_FULL / R_SLEEP
 *   when there is no room now, as put's. R_FALLBACK, nothing done, for anything else: a body
 *   that is not bytes or is too large, an empty queue placed badly (or a batch larger than
 *   the ring), a deleted queue, an empty batch. No log: the Python append logs. */
static int put_many_core(char *seg, uint64_t base, uint64_t cap, Py_ssize_t n, const char *const *bodies,
                         const uint64_t *bls, const char *const *hraws, const uint64_t *hls, uint64_t wait,
                         uint64_t enq, uint64_t *first_out, uint64_t *posts_out);

#define BATCH_ON_STACK 64 /* a batch up to this many items needs no allocation for its pointers */

static PyObject *fast_put_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[3], maxmsg, enq, wait = 0;
    if ((nargs != 7 && nargs != 8) || !PyList_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "put_many takes 7 or 8 arguments, the fourth a list");
        return NULL;
    }
    if (parse_u64s(args, 3, v) < 0 || parse_u64s(args + 5, 1, &maxmsg) < 0 || parse_u64s(args + 6, 1, &enq) < 0 ||
        (nargs == 8 && parse_u64s(args + 7, 1, &wait) < 0))
        return NULL;
    PyObject *bodies = args[3], *hraws = args[4];
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    int one = PyBytes_CheckExact(hraws);
    if (!n || (!one && !(PyList_CheckExact(hraws) && PyList_GET_SIZE(hraws) == n)))
        return PyLong_FromLong(R_FALLBACK);
    for (Py_ssize_t i = 0; i < n; i++) { /* checked before the lock: nothing fails under it */
        PyObject *b = PyList_GET_ITEM(bodies, i), *hr = one ? hraws : PyList_GET_ITEM(hraws, i);
        if (!PyBytes_CheckExact(b) || !PyBytes_CheckExact(hr) || (uint64_t)PyBytes_GET_SIZE(b) > maxmsg)
            return PyLong_FromLong(R_FALLBACK);
    }
    const char *bp_stack[BATCH_ON_STACK], *hp_stack[BATCH_ON_STACK];
    uint64_t bl_stack[BATCH_ON_STACK], hl_stack[BATCH_ON_STACK];
    const char **bp = bp_stack, **hp = hp_stack;
    uint64_t *bl = bl_stack, *hl = hl_stack;
    void *heap = NULL;
    if (n > BATCH_ON_STACK) {
        heap = PyMem_Malloc((size_t)n * (2 * sizeof(char *) + 2 * sizeof(uint64_t)));
        if (!heap) return PyErr_NoMemory();
        bp = (const char **)heap;
        hp = bp + n;
        bl = (uint64_t *)(hp + n);
        hl = bl + n;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyList_GET_ITEM(bodies, i), *hr = one ? hraws : PyList_GET_ITEM(hraws, i);
        bp[i] = PyBytes_AS_STRING(b);
        bl[i] = (uint64_t)PyBytes_GET_SIZE(b);
        hp[i] = PyBytes_AS_STRING(hr);
        hl[i] = (uint64_t)PyBytes_GET_SIZE(hr);
    }
    uint64_t first, posts;
    int rc = put_many_core((char *)(uintptr_t)v[0], v[1], v[2], n, bp, bl, hp, hl, wait, enq, &first, &posts);
    PyMem_Free(heap);
    if (rc) return PyLong_FromLong(rc);
    return Py_BuildValue("(KK)", (unsigned long long)first, (unsigned long long)posts);
}

/* put_many's work: n records (bodies[i] of bls[i] bytes, headers hraws[i] of hls[i]; hraws NULL: none),
 * checked by the caller (bytes, sizes), appended under one lock hold: 0 with the first msg id and
 * the consumer posts owed, or R_* */
static int put_many_core(char *seg, uint64_t base, uint64_t cap, Py_ssize_t n, const char *const *bodies,
                         const uint64_t *bls, const char *const *hraws, const uint64_t *hls, uint64_t wait,
                         uint64_t enq, uint64_t *first_out, uint64_t *posts_out) {
    int rc = lock(seg);
    if (rc) return rc;
    uint64_t *h = HOT(seg);
    if (wait >> 1 & 3) unregister_sleeper(seg, wait >> 3, H_PWAIT, H_PPOSTED, P_PWAIT, (int)(wait >> 1 & 3));
    uint64_t head = h[H_HEAD], tail = h[H_TAIL], end = tail;
    for (Py_ssize_t i = 0; i < n && end - head <= cap; i++) { /* where the tail would be */
        uint64_t size = rec_size(hraws ? hls[i] : 0, bls[i]);
        uint64_t rem = cap - end % cap;
        end += (size > rem ? rem : 0) + size;
    }
    if (h[H_DELETED] || (end - head > cap && head == tail) || new_lap_due(head, tail, cap) || FILL(seg) > tail) {
        unlock(seg); /* an empty queue placed badly, or due a new lap: Python moves it; fills: Python goes after them */
        return R_FALLBACK;
    }
    if (end - head > cap - REC_SIZE && WRAPPED(seg, head)) {
        unlock(seg); /* past an early wrap: Python's */
        return R_FALLBACK;
    }
    if (end - head > cap) { /* no room now: the caller waits for some (R_FULL, R_SLEEP), as put's */
        if (wait & W_REGISTER) register_sleeper(seg, wait >> 3, H_PWAIT, P_PWAIT);
        unlock(seg);
        return wait & W_REGISTER ? R_SLEEP : R_FULL;
    }
    if (end > h[H_ROOM]) { /* memory to allocate first: the Python append */
        unlock(seg);
        return R_FALLBACK;
    }
    uint64_t pos = tail, first = h[H_NEXT_ID], id = first, step = ID_STEP(seg);
    for (Py_ssize_t i = 0; i < n; i++, id += step) { /* the records past the tail, then one commit */
        uint64_t bl = bls[i], hl = hraws ? hls[i] : 0;
        uint64_t size = rec_size(hl, bl);
        pos = placed(seg, base, cap, pos, size);
        char *a = seg + base + pos % cap;
        U64(a + REC_STATUS) = ST_READY;
        U32(a + REC_LENGTH) = (uint32_t)size;
        U32(a + REC_BODY_LEN) = (uint32_t)bl;
        U32(a + REC_HDR_LEN) = (uint32_t)hl;
        U32(a + REC_FLAGS) = 0;
        U64(a + REC_MSG_ID) = id;
        U64(a + REC_ENQ_NS) = enq;
        U64(a + REC_DEADLINE) = 0;
        if (hl) memcpy(a + REC_SIZE, hraws[i], hl);
        memcpy(a + REC_SIZE + hl, bodies[i], bl);
        pos += size;
    }
    *posts_out = commit(h, pos, id, (uint64_t)n);
    *first_out = first;
    unlock(seg);
    return 0;
}

/* nack_many(seg, base, cap, [pos, attempt, msg_id, ...], now, slot)
 *   -> (nacked, consumer posts owed, [indices of those no longer leased]), or R_*: the
 *   immediate requeue (no delay, no retry policy) repeated under one lock hold, as
 *   takes.make_ready does it: ready again with the same attempt, before the frontier. */
static PyObject *fast_nack_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[4], now;
    Py_ssize_t k;
    uint64_t *d = settle_args(args, nargs, "nack_many", v, &now, &k);
    if (!d) return NULL;
    char *seg = (char *)(uintptr_t)v[0];
    uint64_t base = v[1], cap = v[2];
    PyObject *badlist = PyList_New(0);
    if (!badlist) {
        PyMem_Free(d);
        return NULL;
    }
    int rc = lock(seg);
    if (rc) {
        Py_DECREF(badlist);
        PyMem_Free(d);
        return PyLong_FromLong(rc);
    }
    uint64_t *h = HOT(seg), *w = (uint64_t *)seg;
    if (h[H_DELETED]) {
        unlock(seg);
        Py_DECREF(badlist);
        PyMem_Free(d);
        return PyLong_FromLong(R_DELETED);
    }
    uint64_t head = h[H_HEAD], tail = h[H_TAIL], done = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        uint64_t pos = d[3 * i], attempt = d[3 * i + 1], msg_id = d[3 * i + 2];
        char *a = seg + base + pos % cap;
        uint64_t s = pos < head || pos >= tail ? 0 : U64(a);
        if ((s & 0xFF) != ST_LEASED || (s >> 32) != attempt || U64(a + REC_MSG_ID) != msg_id ||
            U64(a + REC_DEADLINE) <= now) {
            d[3 * i] = UINT64_MAX; /* no longer leased (one named twice is nacked once, as two calls would) */
            continue;
        }
        __atomic_store_n((uint64_t *)a, ST_READY | ((uint64_t)NO_HOLDER << 8) | (attempt << 32),
                         __ATOMIC_RELEASE); /* commit */
        h[H_READY] += 1;
        uint32_t flags = U32(a + REC_FLAGS);
        if (flags & FLAG_TTL) w[NEXT_TTL_W] = 0; /* it may expire from now on: the next sweep looks */
        uint32_t lv = flags & 0xFF;
        uint64_t *lp = &w[LEVEL_POS_W + (lv < MAX_PRIORITIES ? lv : MAX_PRIORITIES - 1)];
        if (pos < *lp) *lp = pos; /* its level's first ready record may be it */
        if (!h[H_REQUEUED]++ || pos < h[H_READY_POS]) h[H_READY_POS] = pos;
        done++;
    }
    h[H_IN_FLIGHT] -= done;
    uint64_t post = owe_consumers(h, done);
    unlock(seg);
    for (Py_ssize_t i = 0; i < k; i++) {
        if (d[3 * i] != UINT64_MAX) continue;
        PyObject *x = PyLong_FromSsize_t(i);
        if (!x || PyList_Append(badlist, x) < 0) {
            Py_XDECREF(x);
            Py_DECREF(badlist);
            PyMem_Free(d);
            return NULL;
        }
        Py_DECREF(x);
    }
    PyMem_Free(d);
    return Py_BuildValue("(KKN)", (unsigned long long)done, (unsigned long long)post, badlist);
}

/* reserve(seg, base, cap, size, hraw, slot) -> the position of a record of ``size`` body bytes
 *   claimed as a fill (FILLING, held by ``slot``) past the tail and any fills before it, its
 *   header and headers written, its body and put time not; the lock is let go (``publish`` ends
 *   the fill). Or R_*, nothing done: R_FALLBACK when it does not fit now or needs a pad. */
/* One fill claimed past the tail and the fills before it (reserve's work, the lock held by the caller, ``now``
 * the claim's time; ``checked``: the fill at the tail was looked at already, by this batch's first claim):
 * its position, or R_FALLBACK (nothing done). */
static int64_t claim_fill(char *seg, uint64_t base, uint64_t cap, uint64_t bl, const char *hraw, uint64_t hl,
                          uint64_t slot, uint64_t now, int checked) {
    uint64_t size = rec_size(hl, bl);
    uint64_t *h = HOT(seg);
    uint64_t tail = h[H_TAIL], fill = FILL(seg), end = fill > tail ? fill : tail, off = end % cap;
    if (end == tail && !h[H_DELETED] && new_lap_due(h[H_HEAD], tail, cap) &&
        (tail = start_lap(seg, base, cap, size)) != 0) {
        end = tail; /* the memory just freed, at the ring's start */
        off = 0;
    } else {
        tail = h[H_TAIL];
    }
    uint64_t head = h[H_HEAD];
    if (h[H_DELETED] || (end != tail && !checked && suspect_fill(seg, base, cap, tail, now))) return R_FALLBACK;
    int early = early_wrap_due(head, end, size, cap);
    if (end != head && (early || size > cap - off)) { /* the next lap, as put_core's */
        if (!(end = next_lap(seg, base, cap, head, end, size, early))) return R_FALLBACK;
        off = 0;
    } else if (size > cap - off || end + size - head > cap - (WRAPPED(seg, head) ? REC_SIZE : 0) ||
               (end == tail && new_lap_due(head, tail, cap)) ||
               (end + size > h[H_ROOM] && !room_for(seg, base, cap, head, end, size))) {
        return R_FALLBACK;
    }
    char *a = seg + base + off;
    U64(a + REC_STATUS) = ST_FILLING | slot << 8;
    U32(a + REC_LENGTH) = (uint32_t)size;
    U32(a + REC_BODY_LEN) = (uint32_t)bl;
    U32(a + REC_HDR_LEN) = (uint32_t)hl;
    U32(a + REC_FLAGS) = 0;
    U64(a + REC_MSG_ID) = h[H_NEXT_ID];
    U64(a + REC_ENQ_NS) = now; /* (the claim's time until its publish: ring.suspect_fill) */
    U64(a + REC_DEADLINE) = 0;
    if (hl) memcpy(a + REC_SIZE, hraw, hl);
    h[H_NEXT_ID] += ID_STEP(seg);
    FILL(seg) = end + size;
    return (int64_t)end;
}

static uint64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* reserve's work: the record's position, or R_* (nothing done). Lock taken and let go. */
static int64_t reserve_core(char *seg, uint64_t base, uint64_t cap, uint64_t bl, const char *hraw, uint64_t hl,
                            uint64_t slot) {
    int rc = lock(seg);
    if (rc) return rc;
    int64_t r = claim_fill(seg, base, cap, bl, hraw, hl, slot, wall_ns(), 0);
    unlock(seg);
    return r;
}

static PyObject *fast_reserve(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[4], slot;
    if (nargs != 6 || !PyBytes_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "reserve takes 6 arguments, the fifth bytes");
        return NULL;
    }
    if (parse_u64s(args, 4, v) < 0 || parse_u64s(args + 5, 1, &slot) < 0) return NULL;
    int64_t r = reserve_core((char *)(uintptr_t)v[0], v[1], v[2], v[3], PyBytes_AS_STRING(args[4]),
                             (uint64_t)PyBytes_GET_SIZE(args[4]), slot);
    return r < 0 ? PyLong_FromLong((long)r) : PyLong_FromUnsignedLongLong((uint64_t)r);
}

/* publish(seg, base, cap, pos, enq_ns, not_empty) -> msg_id: the end of the fill ``reserve`` (or
 *   the Python claim) left at ``pos``, the tail moved over it and the done records after it, and a
 *   post to ``not_empty`` for each consumer that wakes; or R_BUSY / R_OWNERDEAD, the lock not taken
 *   or held (Python waits, or repairs, then ends it). Takes and lets go of the lock. */
/* publish's work: the message id (posts owed in ``post``), or R_BUSY / R_OWNERDEAD. */
static int64_t publish_core(char *seg, uint64_t base, uint64_t cap, uint64_t pos, uint64_t enq, uint64_t *post) {
    int rc = lock(seg);
    if (rc) return rc;
    char *a = seg + base + pos % cap;
    uint64_t msg_id = U64(a + REC_MSG_ID);
    *post = 0;
    if ((U64(a) & 0xFF) == ST_FILLING) { /* (as _finish_fill: a fill ends once) */
        U64(a + REC_ENQ_NS) = enq;
        __atomic_store_n((uint64_t *)a, ST_READY, __ATOMIC_RELEASE);
        *post = owe_consumers(HOT(seg), commit_fills(seg, base, cap));
    }
    unlock(seg);
    return (int64_t)msg_id;
}

static PyObject *fast_publish(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[5], post;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "publish takes 6 arguments");
        return NULL;
    }
    if (parse_u64s(args, 5, v) < 0) return NULL;
    int64_t r = publish_core((char *)(uintptr_t)v[0], v[1], v[2], v[3], v[4], &post);
    if (r < 0) return PyLong_FromLong((long)r);
    if (post_sem(args[5], post) < 0) return NULL;
    return PyLong_FromUnsignedLongLong((uint64_t)r);
}

/* A Loan: a writable (or, with ``readonly``, read-only) buffer of ``size`` bytes at ``offset`` of
 * ``owner``'s buffer (a queue's mapping, kept exported while the loan lives, so it is never
 * unmapped under it), which counts the buffers taken from it: ``exports`` is 0 once every view
 * of it is gone (an object that lets go of the export but keeps the loan, as numpy's arrays do,
 * holds a reference instead). */
typedef struct {
    PyObject_HEAD
    Py_buffer owner;
    char *ptr;
    Py_ssize_t len, exports;
    int readonly;
} Loan;

static PyObject *loan_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *owner;
    Py_ssize_t offset, size;
    int readonly = 0;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "Loan(owner, offset, size[, readonly])");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "Onn|p", &owner, &offset, &size, &readonly)) return NULL;
    Loan *self = (Loan *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    if (PyObject_GetBuffer(owner, &self->owner, PyBUF_WRITABLE) < 0) {
        self->owner.obj = NULL;
        Py_DECREF(self);
        return NULL;
    }
    if (offset < 0 || size < 0 || offset > self->owner.len - size) {
        PyErr_SetString(PyExc_ValueError, "Loan: the range is outside the owner's buffer");
        Py_DECREF(self);
        return NULL;
    }
    self->ptr = (char *)self->owner.buf + offset;
    self->len = size;
    self->readonly = readonly;
    return (PyObject *)self;
}

static void loan_dealloc(Loan *self) {
    if (self->owner.obj) PyBuffer_Release(&self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int loan_getbuffer(Loan *self, Py_buffer *view, int flags) {
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->len, self->readonly, flags) < 0) return -1;
    self->exports++;
    return 0;
}

static void loan_releasebuffer(Loan *self, Py_buffer *view) { self->exports--; }

static PyObject *loan_exports(Loan *self, void *closure) { return PyLong_FromSsize_t(self->exports); }

static PyBufferProcs loan_as_buffer = {(getbufferproc)loan_getbuffer, (releasebufferproc)loan_releasebuffer};
static PyGetSetDef loan_getset[] = {{"exports", (getter)loan_exports, NULL, "buffers taken and not released", NULL},
                                    {NULL}};
static PyTypeObject LoanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmq.engine._fast.Loan",
    .tp_basicsize = sizeof(Loan),
    .tp_dealloc = (destructor)loan_dealloc,
    .tp_as_buffer = &loan_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Loan(owner, offset, size): a writable window of owner's buffer that counts its exports",
    .tp_getset = loan_getset,
    .tp_new = loan_new,
};

/* Reservation(q, size, hraw, timeout, slow): ``q.reserve``'s object on the C paths, on an unlogged queue
 * (reserve.py's strategy): entering paces a large body first (the queue's ``_pace``, as a put of it does), then
 * claims the record (reserve_core) and returns a memoryview of a Loan on its body; a normal exit publishes it
 * (publish_core), an exception or a view still alive abandons it (the queue's ``_finish_fill``). Anything else
 * -- the handle closed or not yet in the process table, the lock busy, no room, a pad to place, memory to
 * allocate, a dead holder's lock -- hands the whole block to ``slow(q, size, hraw, timeout, paced)``,
 * reserve.py's Reservation, which waits, places and ends it as before. */
typedef struct {
    PyObject_HEAD
    PyObject *q, *hraw, *timeout, *slow; /* slow: the class, then the object the block was handed to */
    PyObject *loan, *view, *id;
    uint64_t size, pos;
    int state; /* RES_UNUSED, RES_OPEN (claimed here), RES_DONE, RES_HANDED */
} Reservation;

enum { RES_UNUSED, RES_OPEN, RES_DONE, RES_HANDED };
static PyObject *s_segp, *s_base, *s_cap, *s_slot, *s_mm, *s_ne, *s_lockp, *s_finish_fill, *s_repair, *s_release,
    *s_enter, *s_exit, *s_name, *s_pace_idle;

/* Release ``view`` (a memoryview of ``loan``) at the end of a reservation's block: 1 where the loan is still seen
 * (a view or an object made from it alive: nothing may be published), 0 released, -1 on another error. */
static int view_let_go(PyObject *view, PyObject *loan) {
    PyObject *x = PyObject_CallMethodNoArgs(view, s_release);
    int held = 0;
    if (x) {
        Py_DECREF(x);
    } else if (PyErr_ExceptionMatches(PyExc_BufferError)) { /* exported to something still alive (a numpy array) */
        PyErr_Clear();
        held = 1;
    } else {
        return -1;
    }
    return held || ((Loan *)loan)->exports > 0;
}

/* The fills at ``pos[0..k)`` claimed by a call that then failed (an exception set): abandoned through the queue's
 * ``_finish_fill`` (as reservation_enter's), the exception kept. NULL. */
static PyObject *abandon_claimed(PyObject *q, const uint64_t *pos, Py_ssize_t k) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    for (Py_ssize_t i = k - 1; i >= 0; i--) { /* (the last first: each is then taken back whole, id and all) */
        PyObject *x = PyObject_CallMethod(q, "_finish_fill", "KO", (unsigned long long)pos[i], Py_True);
        if (!x) PyErr_Clear();
        Py_XDECREF(x);
    }
    PyErr_Restore(et, ev, tb);
    return NULL;
}

static PyObject *reservation_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *q, *hraw, *timeout, *slow;
    unsigned long long size;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "Reservation(q, size, hraw, timeout, slow)");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OKO!OO", &q, &size, &PyBytes_Type, &hraw, &timeout, &slow)) return NULL;
    Reservation *self = (Reservation *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    Py_INCREF(q);
    Py_INCREF(hraw);
    Py_INCREF(timeout);
    Py_INCREF(slow);
    Py_INCREF(Py_None);
    self->q = q, self->hraw = hraw, self->timeout = timeout, self->slow = slow, self->id = Py_None;
    self->size = size;
    return (PyObject *)self;
}

static void reservation_dealloc(Reservation *self) {
    Py_XDECREF(self->q);
    Py_XDECREF(self->hraw);
    Py_XDECREF(self->timeout);
    Py_XDECREF(self->slow);
    Py_XDECREF(self->view);
    Py_XDECREF(self->loan);
    Py_XDECREF(self->id);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The queue's attribute ``name`` as a uint64 (an int attribute), or -1 with an exception set. */
static int q_u64(PyObject *q, PyObject *name, uint64_t *out, int *negative) {
    PyObject *v = PyObject_GetAttr(q, name);
    if (!v) return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (negative) *negative = x < 0;
    *out = (uint64_t)x;
    return 0;
}

/* Whether a large record of ``size`` bytes is for the queue's ``_pace`` to look at: a window of them
 * (ring.window) ahead of the consumers, or a count of idle waits to end (its ``_pace_idle``); else it
 * returns at once, and is not called. -1 with an exception set when ``_pace_idle`` cannot be read. */
static int pace_due(char *seg, uint64_t cap, PyObject *q, uint64_t size) {
    uint64_t w = WINDOW_RECORDS * size > WINDOW_MIN ? WINDOW_RECORDS * size : WINDOW_MIN, *h = HOT(seg);
    if (size < LARGE || 2 * w > cap) return 0;
    if (h[H_TAIL] - h[H_HEAD] >= w) return 1;
    PyObject *idle = PyObject_GetAttr(q, s_pace_idle);
    if (!idle) return -1;
    int due = PyObject_IsTrue(idle);
    Py_DECREF(idle);
    return due;
}

/* The block handed to the Python Reservation: its __enter__'s result. */
static PyObject *reservation_hand(Reservation *self, int paced) {
    PyObject *slow = PyObject_CallFunction(self->slow, "OKOOO", self->q, (unsigned long long)self->size, self->hraw,
                                           self->timeout, paced ? Py_True : Py_False);
    if (!slow) return NULL;
    Py_SETREF(self->slow, slow);
    self->state = RES_HANDED;
    return PyObject_CallMethodNoArgs(slow, s_enter);
}

static PyObject *reservation_enter(Reservation *self, PyObject *unused) {
    if (self->state != RES_UNUSED) {
        PyErr_SetString(PyExc_RuntimeError, "a reservation is entered once");
        return NULL;
    }
    PyObject *q = self->q, *lockp = PyObject_GetAttr(q, s_lockp);
    if (!lockp) return NULL;
    int closed = lockp == Py_None, unslotted = 0;
    Py_DECREF(lockp);
    uint64_t segp, base, cap, slot;
    if (closed) return reservation_hand(self, 0); /* (it raises the closed handle's error) */
    if (q_u64(q, s_segp, &segp, NULL) < 0 || q_u64(q, s_base, &base, NULL) < 0 || q_u64(q, s_cap, &cap, NULL) < 0 ||
        q_u64(q, s_slot, &slot, &unslotted) < 0)
        return NULL;
    if (unslotted) return reservation_hand(self, 0); /* (it registers this process first) */
    int paced = self->size >= FILL_MIN;
    uint64_t rec = rec_size((uint64_t)PyBytes_GET_SIZE(self->hraw), self->size);
    int due = paced ? pace_due((char *)(uintptr_t)segp, cap, q, rec) : 0;
    if (due < 0) return NULL;
    if (due) {
        /* a large body waits a moment while the consumers drain a window of them (produce._pace) */
        PyObject *x = PyObject_CallMethod(q, "_pace", "KO", (unsigned long long)rec, self->timeout);
        if (!x) return NULL;
        Py_DECREF(x);
    }
    int64_t r = reserve_core((char *)(uintptr_t)segp, base, cap, self->size, PyBytes_AS_STRING(self->hraw),
                             (uint64_t)PyBytes_GET_SIZE(self->hraw), slot);
    if (r < 0) {
        if (r == R_OWNERDEAD) { /* held, from a dead holder: repaired, then the Python path */
            PyObject *x = PyObject_CallMethodNoArgs(q, s_repair);
            if (!x) return NULL;
            Py_DECREF(x);
        }
        return reservation_hand(self, paced);
    }
    self->pos = (uint64_t)r;
    self->state = RES_OPEN; /* the record is ours from here: any failure below abandons it */
    PyObject *mm = PyObject_GetAttr(q, s_mm);
    Loan *loan = mm ? (Loan *)LoanType.tp_alloc(&LoanType, 0) : NULL;
    if (loan) {
        uint64_t off = base + self->pos % cap + REC_SIZE + (uint64_t)PyBytes_GET_SIZE(self->hraw);
        if (PyObject_GetBuffer(mm, &loan->owner, PyBUF_WRITABLE) < 0) {
            loan->owner.obj = NULL;
            Py_CLEAR(loan);
        } else {
            loan->ptr = (char *)loan->owner.buf + off;
            loan->len = (Py_ssize_t)self->size;
        }
    }
    Py_XDECREF(mm);
    PyObject *view = loan ? PyMemoryView_FromObject((PyObject *)loan) : NULL;
    if (!view) {
        Py_XDECREF(loan);
        self->state = RES_DONE;
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyObject *x = PyObject_CallMethod(q, "_finish_fill", "KO", (unsigned long long)self->pos, Py_True);
        Py_XDECREF(x);
        PyErr_Restore(et, ev, tb);
        return NULL;
    }
    self->loan = (PyObject *)loan;
    self->view = view;
    Py_INCREF(view);
    return view;
}

static PyObject *reservation_exit(Reservation *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "__exit__ takes 3 arguments");
        return NULL;
    }
    if (self->state == RES_HANDED) return PyObject_VectorcallMethod(s_exit, (PyObject *[]){self->slow, args[0],
                                                                    args[1], args[2]}, 4, NULL);
    if (self->state != RES_OPEN) {
        PyErr_SetString(PyExc_RuntimeError, "the reservation is not open");
        return NULL;
    }
    self->state = RES_DONE;
    PyObject *view = self->view, *loan = self->loan, *q = self->q;
    self->view = self->loan = NULL;
    int held = view_let_go(view, loan);
    Py_DECREF(view);
    Py_DECREF(loan);
    if (held < 0) return NULL;
    PyObject *x;
    if (args[0] != Py_None || held) { /* nothing published */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        x = PyObject_CallMethod(q, "_finish_fill", "KO", (unsigned long long)self->pos, Py_True);
        if (!x) return NULL;
        Py_DECREF(x);
        PyErr_Restore(et, ev, tb);
        if (args[0] == Py_None) {
            PyErr_SetString(PyExc_BufferError, "a view of the reserved buffer is still alive as the block ends (a "
                            "slice, or an object made from it): nothing was published; let it go inside the block");
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    uint64_t segp, base, cap, post = 0;
    if (q_u64(q, s_segp, &segp, NULL) < 0 || q_u64(q, s_base, &base, NULL) < 0 || q_u64(q, s_cap, &cap, NULL) < 0)
        return NULL;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t r = publish_core((char *)(uintptr_t)segp, base, cap, self->pos,
                             (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec, &post);
    PyObject *id;
    if (r >= 0) {
        PyObject *ne = PyObject_GetAttr(q, s_ne);
        int bad = !ne || post_sem(ne, post) < 0;
        Py_XDECREF(ne);
        if (bad) return NULL;
        id = PyLong_FromUnsignedLongLong((uint64_t)r);
    } else { /* busy, or taken from a dead holder: Python waits (or repairs), then ends it */
        if (r == R_OWNERDEAD) {
            x = PyObject_CallMethodNoArgs(q, s_repair);
            if (!x) return NULL;
            Py_DECREF(x);
        }
        id = PyObject_CallMethod(q, "_finish_fill", "K", (unsigned long long)self->pos);
    }
    if (!id) return NULL;
    Py_SETREF(self->id, id);
    Py_RETURN_FALSE;
}

static PyObject *reservation_id(Reservation *self, void *closure) {
    if (self->state == RES_HANDED) return PyObject_GetAttrString(self->slow, "id");
    Py_INCREF(self->id);
    return self->id;
}

static PyObject *reservation_repr(Reservation *self) {
    if (self->state == RES_HANDED) return PyObject_Repr(self->slow);
    PyObject *name = PyObject_GetAttr(self->q, s_name);
    if (!name) return NULL;
    const char *st = self->state == RES_OPEN ? "open" : self->state == RES_UNUSED ? "unused"
                     : self->id != Py_None ? "published" : "abandoned";
    PyObject *r = PyUnicode_FromFormat("<Reservation %U %lluB %s>", name, (unsigned long long)self->size, st);
    Py_DECREF(name);
    return r;
}

static PyMethodDef reservation_methods[] = {
    {"__enter__", (PyCFunction)reservation_enter, METH_NOARGS, "Claim the record: a writable memoryview of its body."},
    {"__exit__", (PyCFunction)(void (*)(void))reservation_exit, METH_FASTCALL,
     "Publish the record (or abandon it: an exception, or a view still alive)."},
    {NULL}};
static PyGetSetDef reservation_getset[] = {
    {"id", (getter)reservation_id, NULL, "the message id once published (None before, and after a block that raised)",
     NULL},
    {NULL}};
static PyTypeObject ReservationType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmq.engine._fast.Reservation",
    .tp_basicsize = sizeof(Reservation),
    .tp_dealloc = (destructor)reservation_dealloc,
    .tp_repr = (reprfunc)reservation_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reservation(q, size, hraw, timeout, slow): q.reserve's object on the C paths",
    .tp_methods = reservation_methods,
    .tp_getset = reservation_getset,
    .tp_new = reservation_new,
};

/* Reservations(q, sizes, hraw, timeout): ``q.reserve_many``'s object on the C paths, on an unlogged queue:
 * entering claims a fill per size of ``sizes`` (a list of ints) from the first while they are under FILL_MIN,
 * as many as fit now, in one hold of the lock, and returns a list of writable memoryviews of Loans on their
 * bodies; a normal exit publishes them all in one hold of it, an exception or a view still alive abandons them
 * all (the queue's ``_finish_fill``). Where none is claimed (no room, a large first body, the lock busy or a dead
 * holder's, the handle closed or not yet in the process table) the block is handed to the queue's one
 * reservation of the first size (``q._reservation``), which waits for room: a batch of one. Both ends are C,
 * with no Python frame for a signal's exception to land in between a claim and its end. */
typedef struct {
    PyObject_HEAD
    PyObject *q, *sizes, *hraw, *timeout, *one, *views, *ids;
    uint64_t *pos;
    Py_ssize_t k;
    int state; /* RES_UNUSED, RES_OPEN (claimed here), RES_DONE, RES_HANDED (to ``one``) */
} Batch;

static PyObject *s_reservation, *s_id;

static PyObject *batch_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *q, *sizes, *hraw, *timeout;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "Reservations(q, sizes, hraw, timeout)");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!O!O", &q, &PyList_Type, &sizes, &PyBytes_Type, &hraw, &timeout)) return NULL;
    if (!PyList_GET_SIZE(sizes)) {
        PyErr_SetString(PyExc_ValueError, "sizes is empty");
        return NULL;
    }
    Batch *self = (Batch *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    Py_INCREF(q);
    Py_INCREF(sizes);
    Py_INCREF(hraw);
    Py_INCREF(timeout);
    Py_INCREF(Py_None);
    self->q = q, self->sizes = sizes, self->hraw = hraw, self->timeout = timeout, self->ids = Py_None;
    return (PyObject *)self;
}

static void batch_dealloc(Batch *self) {
    Py_XDECREF(self->q);
    Py_XDECREF(self->sizes);
    Py_XDECREF(self->hraw);
    Py_XDECREF(self->timeout);
    Py_XDECREF(self->one);
    Py_XDECREF(self->views);
    Py_XDECREF(self->ids);
    PyMem_Free(self->pos);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The block handed to the queue's one reservation of the first size: [its view]. */
static PyObject *batch_hand(Batch *self) {
    PyObject *one = PyObject_CallMethodObjArgs(self->q, s_reservation, PyList_GET_ITEM(self->sizes, 0), self->hraw,
                                               self->timeout, NULL);
    if (!one) return NULL;
    self->one = one;
    self->state = RES_HANDED;
    PyObject *view = PyObject_CallMethodNoArgs(one, s_enter);
    if (!view) return NULL;
    PyObject *out = PyList_New(1);
    if (!out) { /* (the one is open: abandoned, as by an exception in its block) */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        PyObject *x = PyObject_CallMethodObjArgs(one, s_exit, et, ev ? ev : Py_None, tb ? tb : Py_None, NULL);
        Py_XDECREF(x);
        PyErr_Clear();
        PyErr_Restore(et, ev, tb);
        Py_DECREF(view);
        return NULL;
    }
    PyList_SET_ITEM(out, 0, view);
    return out;
}

/* Abandon this batch's claimed fills (the exception set, if any, kept). */
static void batch_abandon(Batch *self) {
    abandon_claimed(self->q, self->pos, self->k);
}

static PyObject *batch_enter(Batch *self, PyObject *unused) {
    if (self->state != RES_UNUSED) {
        PyErr_SetString(PyExc_RuntimeError, "a reservation is entered once");
        return NULL;
    }
    PyObject *q = self->q, *lockp = PyObject_GetAttr(q, s_lockp);
    if (!lockp) return NULL;
    int closed = lockp == Py_None, unslotted = 0;
    Py_DECREF(lockp);
    uint64_t segp, base, cap, slot;
    if (closed) return batch_hand(self); /* (it raises the closed handle's error) */
    if (q_u64(q, s_segp, &segp, NULL) < 0 || q_u64(q, s_base, &base, NULL) < 0 || q_u64(q, s_cap, &cap, NULL) < 0 ||
        q_u64(q, s_slot, &slot, &unslotted) < 0)
        return NULL;
    if (unslotted) return batch_hand(self); /* (it registers this process first) */
    PyObject *sizes = self->sizes;
    Py_ssize_t n = PyList_GET_SIZE(sizes);
    uint64_t hl = (uint64_t)PyBytes_GET_SIZE(self->hraw), *bl = PyMem_Malloc(n * 2 * sizeof(uint64_t));
    if (!bl) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long x = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(sizes, i));
        if (x == (unsigned long long)-1 && PyErr_Occurred()) {
            PyMem_Free(bl);
            return NULL;
        }
        if (x >= FILL_MIN) { /* (from a large one on, nothing is claimed together) */
            n = i;
            break;
        }
        bl[i] = x;
    }
    PyObject *mm = n ? PyObject_GetAttr(q, s_mm) : NULL;
    if (n && !mm) {
        PyMem_Free(bl);
        return NULL;
    }
    char *seg = (char *)(uintptr_t)segp;
    int rc = n ? lock(seg) : R_FALLBACK;
    Py_ssize_t k = 0;
    if (!rc) {
        uint64_t now = wall_ns();
        for (; k < n; k++) {
            int64_t r = claim_fill(seg, base, cap, bl[k], PyBytes_AS_STRING(self->hraw), hl, slot, now, k > 0);
            if (r < 0) break;
            bl[n + k] = (uint64_t)r;
        }
        unlock(seg);
    }
    if (!k) {
        Py_XDECREF(mm);
        PyMem_Free(bl);
        if (rc == R_OWNERDEAD) { /* held, from a dead holder: repaired, then the one reservation */
            PyObject *x = PyObject_CallMethodNoArgs(q, s_repair);
            if (!x) return NULL;
            Py_DECREF(x);
        }
        return batch_hand(self);
    }
    /* the claimed fills are ours from here: a failure below abandons them */
    self->state = RES_OPEN;
    self->k = k;
    self->pos = PyMem_Malloc(k * sizeof(uint64_t));
    if (!self->pos) {
        Py_DECREF(mm);
        PyErr_NoMemory();
        self->state = RES_DONE;
        self->k = 0;
        abandon_claimed(q, bl + n, k); /* (before bl, which holds the positions, is freed) */
        PyMem_Free(bl);
        return NULL;
    }
    memcpy(self->pos, bl + n, k * sizeof(uint64_t));
    PyObject *views = PyList_New(k), *out = NULL;
    for (Py_ssize_t i = 0; views && i < k; i++) {
        Loan *loan = (Loan *)LoanType.tp_alloc(&LoanType, 0);
        PyObject *view = NULL;
        if (loan && PyObject_GetBuffer(mm, &loan->owner, PyBUF_WRITABLE) == 0) {
            loan->ptr = (char *)loan->owner.buf + base + self->pos[i] % cap + REC_SIZE + hl;
            loan->len = (Py_ssize_t)bl[i];
            view = PyMemoryView_FromObject((PyObject *)loan);
        } else if (loan) {
            loan->owner.obj = NULL;
        }
        Py_XDECREF(loan); /* (the view holds it) */
        if (!view) Py_CLEAR(views);
        else PyList_SET_ITEM(views, i, view);
    }
    Py_DECREF(mm);
    PyMem_Free(bl);
    if (views) out = PyList_GetSlice(views, 0, k); /* (the caller's list: its views are released from ours) */
    if (!out) {
        self->state = RES_DONE;
        Py_XDECREF(views);
        batch_abandon(self);
        return NULL;
    }
    self->views = views;
    return out;
}

static PyObject *batch_exit(Batch *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "__exit__ takes 3 arguments");
        return NULL;
    }
    PyObject *q = self->q, *x;
    if (self->state == RES_HANDED) {
        self->state = RES_DONE;
        x = PyObject_VectorcallMethod(s_exit, (PyObject *[]){self->one, args[0], args[1], args[2]}, 4, NULL);
        if (!x) return NULL;
        Py_DECREF(x);
        PyObject *id = PyObject_GetAttr(self->one, s_id);
        if (!id) return NULL;
        if (id != Py_None) {
            PyObject *ids = PyList_New(1);
            if (!ids) {
                Py_DECREF(id);
                return NULL;
            }
            PyList_SET_ITEM(ids, 0, id);
            Py_SETREF(self->ids, ids);
        } else {
            Py_DECREF(id);
        }
        Py_RETURN_FALSE;
    }
    if (self->state != RES_OPEN) {
        PyErr_SetString(PyExc_RuntimeError, "the reservation is not open");
        return NULL;
    }
    self->state = RES_DONE;
    PyObject *views = self->views;
    self->views = NULL;
    int held = 0;
    for (Py_ssize_t i = 0; i < self->k; i++) {
        PyObject *view = PyList_GET_ITEM(views, i), *loan = PyMemoryView_GET_BUFFER(view)->obj;
        if (!loan) continue; /* (released already) */
        Py_INCREF(loan);
        int seen = view_let_go(view, loan);
        Py_DECREF(loan);
        if (seen < 0) PyErr_Clear(); /* (a release cannot fail otherwise: counted as still seen) */
        held = held || seen;
    }
    Py_DECREF(views);
    if (args[0] != Py_None || held) { /* nothing published */
        batch_abandon(self);
        if (PyErr_Occurred()) return NULL;
        if (args[0] == Py_None) {
            PyErr_SetString(PyExc_BufferError, "a view of a reserved buffer is still alive as the block ends (a "
                            "slice, or an object made from it): nothing was published; let them go inside the block");
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    uint64_t segp, base, cap, post = 0;
    PyObject *ids = PyList_New(self->k);
    if (!ids || q_u64(q, s_segp, &segp, NULL) < 0 || q_u64(q, s_base, &base, NULL) < 0 ||
        q_u64(q, s_cap, &cap, NULL) < 0) {
        Py_XDECREF(ids);
        batch_abandon(self);
        return NULL;
    }
    char *seg = (char *)(uintptr_t)segp;
    int rc = lock(seg);
    if (!rc) {
        uint64_t enq = wall_ns();
        for (Py_ssize_t i = 0; i < self->k; i++) {
            char *a = seg + base + self->pos[i] % cap;
            self->pos[i] = U64(a + REC_MSG_ID); /* (the position is spent: its id in its place) */
            if ((U64(a) & 0xFF) == ST_FILLING) { /* (as _finish_fill: a fill ends once) */
                U64(a + REC_ENQ_NS) = enq;
                __atomic_store_n((uint64_t *)a, ST_READY, __ATOMIC_RELEASE);
            }
        }
        post = owe_consumers(HOT(seg), commit_fills(seg, base, cap));
        unlock(seg);
        for (Py_ssize_t i = 0; i < self->k; i++) {
            PyObject *id = PyLong_FromUnsignedLongLong(self->pos[i]);
            if (!id) {
                Py_CLEAR(ids);
                break;
            }
            PyList_SET_ITEM(ids, i, id);
        }
        PyObject *ne = PyObject_GetAttr(q, s_ne);
        int bad = !ne || post_sem(ne, post) < 0;
        Py_XDECREF(ne);
        if (bad || !ids) {
            Py_XDECREF(ids);
            return NULL;
        }
    } else { /* busy, or taken from a dead holder: Python waits (or repairs), then ends them */
        if (rc == R_OWNERDEAD) {
            x = PyObject_CallMethodNoArgs(q, s_repair);
            if (!x) {
                Py_DECREF(ids);
                return NULL;
            }
            Py_DECREF(x);
        }
        for (Py_ssize_t i = 0; i < self->k; i++) {
            PyObject *id = PyObject_CallMethod(q, "_finish_fill", "K", (unsigned long long)self->pos[i]);
            if (!id) {
                Py_DECREF(ids);
                return NULL;
            }
            PyList_SET_ITEM(ids, i, id);
        }
    }
    Py_SETREF(self->ids, ids);
    Py_RETURN_FALSE;
}

static PyObject *batch_ids(Batch *self, void *closure) {
    Py_INCREF(self->ids);
    return self->ids;
}

static PyObject *batch_repr(Batch *self) {
    PyObject *name = PyObject_GetAttr(self->q, s_name);
    if (!name) return NULL;
    const char *state = self->ids != Py_None ? "published" : self->state == RES_OPEN || self->state == RES_HANDED
                                                                  ? "open" : self->state == RES_DONE ? "abandoned" : "unused";
    PyObject *r = PyUnicode_FromFormat("<Reservations %U %zd sizes %s>", name, PyList_GET_SIZE(self->sizes), state);
    Py_DECREF(name);
    return r;
}

static PyMethodDef batch_methods[] = {
    {"__enter__", (PyCFunction)batch_enter, METH_NOARGS, "Claim the records: a list of writable memoryviews."},
    {"__exit__", (PyCFunction)(void (*)(void))batch_exit, METH_FASTCALL,
     "Publish the records (or abandon them: an exception, or a view still alive)."},
    {NULL}};
static PyGetSetDef batch_getset[] = {
    {"ids", (getter)batch_ids, NULL, "the message ids once published (None before, and after a block that raised)",
     NULL},
    {NULL}};
static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmq.engine._fast.Reservations",
    .tp_basicsize = sizeof(Batch),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_repr = (reprfunc)batch_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reservations(q, sizes, hraw, timeout): q.reserve_many's object on the C paths",
    .tp_methods = batch_methods,
    .tp_getset = batch_getset,
    .tp_new = batch_new,
};

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
    return (pos == head || (pos % cap == 0 && pos - head < cap)) && advance_head(seg, base, cap) && owe_producer(h);
}

/* The plain ack's check and commit (lock held, the queue not deleted): 1 if a producer is owed
 * a post now, else 0; R_EXPIRED (no longer leased as delivered: nothing changed); R_FALLBACK (a
 * log this path does not append to, or a full disk: the Python path logs into the reserve); R_OSERROR
 * (the log's write failed: errno says why). */
static inline int ack_locked(char *seg, uint64_t base, uint64_t cap, uint64_t pos, uint64_t attempt,
                             uint64_t msg_id, uint64_t now, long wal_fd, uint64_t wal_gen, uint64_t slot) {
    uint64_t *h = HOT(seg);
    uint64_t head = h[H_HEAD];
    if (pos < head || pos >= h[H_TAIL]) return R_EXPIRED; /* (first: memory outside may have been given back) */
    char *a = seg + base + pos % cap;
    uint64_t w = U64(a);
    if ((w & 0xFF) != ST_LEASED || (w >> 32) != attempt || U64(a + REC_MSG_ID) != msg_id ||
        U64(a + REC_DEADLINE) <= now)
        return R_EXPIRED;
    if (wal_fd >= 0) { /* logged before the commit below */
        unsigned char entry[LOG_HEAD + 4];
        if (!wal_usable(seg, wal_gen)) return R_FALLBACK;
        size_t n = log_entry(entry, LOG_ACK, 0, 0, attempt, msg_id, 0);
        if (wal_write(seg, (int)wal_fd, entry, n) < 0) /* a full disk: the Python path logs it into the reserve */
            return errno == ENOSPC ? R_FALLBACK : R_OSERROR;
    }
    __atomic_store_n((uint64_t *)a, (w & ~(uint64_t)0xFF) | ST_ACKED, __ATOMIC_RELEASE); /* commit */
    h[H_IN_FLIGHT] -= 1;
    *PROC_W(seg, slot, P_ACKED) += 1;
    return freed_at(seg, base, cap, pos, head);
}

/* ack(seg, base, cap, pos, attempt, msg_id, now, wal_fd, wal_gen, slot)
 *   -> 1 if a producer must be woken, else 0; or R_*
 * wal_fd < 0: no log; else the ACK entry is appended to it before the commit */
static int ack_core(char *seg, uint64_t base, uint64_t cap, uint64_t pos, uint64_t attempt, uint64_t msg_id,
                    uint64_t now, long wal_fd, uint64_t wal_gen, uint64_t slot) {
    int rc = lock(seg);
    if (rc) return rc;
    if (HOT(seg)[H_DELETED]) {
        unlock(seg);
        return R_DELETED;
    }
    rc = ack_locked(seg, base, cap, pos, attempt, msg_id, now, wal_fd, wal_gen, slot);
    int err = errno;
    unlock(seg);
    errno = err; /* (R_OSERROR: why the log's write failed) */
    return rc;
}

static PyObject *fast_ack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[7], slot;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "ack takes 10 arguments");
        return NULL;
    }
    if (parse_u64s(args, 7, v) < 0 || parse_u64s(args + 9, 1, &slot) < 0) return NULL;
    long wal_fd = PyLong_AsLong(args[7]);
    if (wal_fd == -1 && PyErr_Occurred()) return NULL;
    uint64_t wal_gen = PyLong_AsUnsignedLongLong(args[8]);
    if (wal_gen == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    int rc = ack_core((char *)(uintptr_t)v[0], v[1], v[2], v[3], v[4], v[5], v[6], wal_fd, wal_gen, slot);
    if (rc == R_OSERROR) return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(rc);
}

/* take_next(q, seg, base, cap, slot, vis_ns, max_deliveries or 0, now, mode, ring, prev, wal_fd, wal_gen)
 *   -> take's result after acking ``prev`` (a Delivery of ``q``) in the same lock hold: the
 *   consume loop's step (Queue.messages). ``prev`` is acked only if it is still leased as it
 *   was delivered (ack's checks: the application settled it, or its lease lapsed: left as it
 *   is). A producer owed a post for the room the ack freed: (result, 1). R_BUSY / R_OWNERDEAD,
 *   and R_FALLBACK from a deleted queue or a log this path does not append to, mean ``prev``
 *   was not looked at (Python acks it); every other R_* comes after it was. mode: M_VIEW or 0. */
static PyObject *fast_take_next(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[8], p[3];
    if (nargs != 13 || !delivery_class) {
        PyErr_SetString(PyExc_TypeError, "take_next takes 13 arguments (and a delivery class set)");
        return NULL;
    }
    PyObject *q = args[0], *ring = args[9], *prev = args[10];
    if (!PyObject_TypeCheck(prev, &DeliveryBaseType) || ((DeliveryBase *)prev)->q != q) {
        PyErr_SetString(PyExc_TypeError, "take_next: prev must be a delivery of this queue handle");
        return NULL;
    }
    DeliveryBase *d = (DeliveryBase *)prev;
    PyObject *pv[3] = {d->pos, d->attempt, d->id};
    if (!pv[0] || !pv[1] || !pv[2]) {
        PyErr_SetString(PyExc_TypeError, "take_next: prev has no position, attempt or id");
        return NULL;
    }
    if (parse_u64s(args + 1, 8, v) < 0 || parse_u64s(pv, 3, p) < 0) return NULL;
    long wal_fd = PyLong_AsLong(args[11]);
    if (wal_fd == -1 && PyErr_Occurred()) return NULL;
    uint64_t wal_gen = PyLong_AsUnsignedLongLong(args[12]);
    if (wal_gen == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    char *seg = (char *)(uintptr_t)v[0];
    uint64_t base = v[1], cap = v[2], slot = v[3], vis_ns = v[4], maxdel = v[5], now = v[6];
    int mode = (int)v[7] & M_VIEW;

    int rc = lock(seg);
    if (rc) return PyLong_FromLong(rc);
    if (HOT(seg)[H_DELETED]) {
        unlock(seg);
        return PyLong_FromLong(R_FALLBACK);
    }
    rc = ack_locked(seg, base, cap, p[0], p[1], p[2], now, wal_fd, wal_gen, slot);
    if (rc == R_OSERROR) {
        int err = errno;
        unlock(seg);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (rc == R_FALLBACK) { /* a log the C path does not append to: Python acks, then takes */
        unlock(seg);
        return PyLong_FromLong(R_FALLBACK);
    }
    int post = rc == 1;
    rc = take_checks(seg, slot, now, 0);
    PyObject *r = rc ? PyLong_FromLong(rc) : take_locked(q, seg, base, cap, slot, vis_ns, maxdel, now, mode, ring);
    if (!post || !r) return r; /* (a MemoryError after the ack: the producer's next sleep slice sees the room) */
    return Py_BuildValue("(Ni)", r, 1);
}


/* A stream partition's records as Arrow buffers: from position pos (of the record the
 * caller found, holding the partition's lock) up to tail, at most max_records, stopping at
 * a gap in the offsets and at offset stop (the last stable offset); a transaction's marker
 * and an aborted transaction's records are passed over. Returns (n, value offsets, values,
 * key offsets, keys, key validity, header offsets, headers, value validity or None (no null
 * value), offsets, timestamps in us, the offset after the last record looked at, 0 if
 * none): int32 offsets, validity bitmaps, int64 columns -- so a bulk reader (the Spark
 * source) makes its columns without a Python object per record. */
static PyObject *fast_read_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "read_columns(buffer, base, cap, pos, tail, max_records, stop, clean)");
        return NULL;
    }
    uint64_t base = PyLong_AsUnsignedLongLong(args[1]), cap = PyLong_AsUnsignedLongLong(args[2]);
    uint64_t pos = PyLong_AsUnsignedLongLong(args[3]), tail = PyLong_AsUnsignedLongLong(args[4]);
    Py_ssize_t max = PyLong_AsSsize_t(args[5]);
    uint64_t stop = PyLong_AsUnsignedLongLong(args[6]);
    long long clean = PyLong_AsLongLong(args[7]); /* a gap up to this offset is a compaction's (-1: none) */
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    if (cap < REC_SIZE || base + cap > (uint64_t)view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "read_columns: the ring is outside the buffer");
        return NULL;
    }
    const char *mem = (const char *)view.buf;
    Py_ssize_t n = 0, nulls = 0;
    uint64_t vbytes = 0, kbytes = 0, hbytes = 0, prev = 0, p = pos, next = 0;
    for (int pass = 0; pass < 2; pass++) {
        PyObject *out[10] = {NULL};
        char *vo = NULL, *vd = NULL, *ko = NULL, *kd = NULL, *kv = NULL, *ho = NULL, *hd = NULL, *of = NULL,
             *ts = NULL, *vv = NULL;
        if (pass == 1) {
            Py_ssize_t sizes[10] = {(n + 1) * 4, (Py_ssize_t)vbytes, (n + 1) * 4, (Py_ssize_t)kbytes, (n + 7) / 8,
                                    (n + 1) * 4, (Py_ssize_t)hbytes, n * 8, n * 8, (n + 7) / 8};
            int fields = nulls ? 10 : 9; /* the value validity only where a value is null */
            for (int i = 0; i < fields; i++) {
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
            if (nulls) {
                vv = PyBytes_AS_STRING(out[9]);
                memset(vv, 0, (n + 7) / 8);
            } else {
                Py_INCREF(Py_None);
                out[9] = Py_None;
            }
            U32(vo) = U32(ko) = U32(ho) = 0;
        }
        Py_ssize_t want = pass == 0 ? max : n, i = 0;
        uint32_t vat = 0, kat = 0, hat = 0;
        Py_ssize_t looked = 0; /* records looked at (passed over or taken): the first pass takes max of them */
        p = pos;
        while (p < tail && i < want && (pass == 1 || looked < max)) {
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
                uint32_t flags = U32(a + REC_FLAGS);
                int null = (flags & FLAG_NULL_VALUE) != 0; /* a tombstone (its body is empty) */
                if (looked && off != prev + 1 && (long long)off > clean) break; /* a gap: the next read is told */
                if (off >= stop) break; /* an open transaction's, or after one */
                prev = off;
                looked++;
                if (flags & (FLAG_CONTROL | FLAG_ABORTED)) { /* a marker, an aborted record: passed over */
                    p += length;
                    continue;
                }
                if (pass == 0) {
                    vbytes += bl; kbytes += kl; hbytes += hl - kl; nulls += null;
                } else {
                    const char *b = a + REC_SIZE;
                    memcpy(kd + kat, b, kl);
                    memcpy(hd + hat, b + kl, hl - kl);
                    memcpy(vd + vat, b + hl, bl);
                    kat += kl; hat += hl - kl; vat += bl;
                    if (klen) kv[i >> 3] |= (char)(1 << (i & 7));
                    if (vv && !null) vv[i >> 3] |= (char)(1 << (i & 7));
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
            next = looked ? prev + 1 : 0;
            if (vbytes > INT32_MAX || kbytes > INT32_MAX || hbytes > INT32_MAX) {
                PyBuffer_Release(&view);
                PyErr_SetString(PyExc_ValueError, "read_columns: more than 2 GiB in one call: ask for fewer records");
                return NULL;
            }
        } else {
            PyBuffer_Release(&view);
            return Py_BuildValue("(nNNNNNNNNNNK)", n, out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[9],
                                 out[7], out[8], (unsigned long long)next);
        }
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE; /* not reached */
}

/* ---- a compaction's scan (streams/compaction.py ``_plan``, its Python twin): the records of a
 * copy of a partition's ring from ``head`` to ``stop`` (``ring.copy_used``: positions from head,
 * across the ring's end), walked as the ring is; returns (kept, removed): ``kept`` packed int64
 * triples (the record's place in the copy, its length, its offset) in order, of the records that
 * stay; with ``compact`` 0 every record but the pads stays. With it: a record of a key
 * (neither a marker nor aborted) stays only if it is the key's latest, and a tombstone only while
 * ``wall_ns`` - its time <= ``delete_ns``; an aborted record goes; a record without a key and a
 * marker stay. A length that walks out of the copy (torn: the caller copied it while it moved)
 * raises ValueError. */
static PyObject *fast_compact_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "compact_scan(copy, cap, head, stop, wall_ns, delete_ns, compact)");
        return NULL;
    }
    uint64_t cap = PyLong_AsUnsignedLongLong(args[1]), head = PyLong_AsUnsignedLongLong(args[2]);
    uint64_t stop = PyLong_AsUnsignedLongLong(args[3]);
    long long wall = PyLong_AsLongLong(args[4]), delete_ns = PyLong_AsLongLong(args[5]);
    int compact = PyObject_IsTrue(args[6]);
    if (PyErr_Occurred() || compact < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const char *mem = (const char *)view.buf;
    if (cap < REC_SIZE || stop < head || stop - head > (uint64_t)view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "compact_scan: the run is outside the copy");
        return NULL;
    }
    Py_ssize_t n = 0, room = 1024;
    int64_t *recs = PyMem_Malloc(room * 4 * sizeof(int64_t)); /* o, length, offset, key object or 0 */
    PyObject *latest = compact ? PyDict_New() : NULL, *kept = NULL, *result = NULL, *index = NULL;
    Py_ssize_t removed = 0, k = 0;
    if (!recs || (compact && !latest)) {
        PyErr_NoMemory();
        goto done;
    }
    for (uint64_t p = head; p < stop;) {
        uint64_t rem = cap - p % cap;
        if (rem < REC_SIZE) { /* an implicit pad: the next lap */
            p += rem;
            continue;
        }
        const char *a = mem + (p - head);
        uint32_t length = U32(a + REC_LENGTH);
        if (length < REC_SIZE || length % 8 || p - head + length > stop - head) {
            PyErr_SetString(PyExc_ValueError, "compact_scan: a torn record (the copy moved under it)");
            goto done;
        }
        if ((U64(a + REC_STATUS) & 0xFF) != ST_PAD) {
            if (n == room) {
                int64_t *more = PyMem_Realloc(recs, 2 * room * 4 * sizeof(int64_t));
                if (!more) {
                    PyErr_NoMemory();
                    goto done;
                }
                recs = more;
                room *= 2;
            }
            int64_t *r = recs + 4 * n;
            uint32_t flags = U32(a + REC_FLAGS);
            uint64_t klen = U64(a + REC_DEADLINE);
            r[0] = (int64_t)(p - head); r[1] = length; r[2] = (int64_t)U64(a + REC_MSG_ID); r[3] = 0;
            n++;
            if (compact && klen && !(flags & FLAG_CONTROL)) {
                if (klen - 1 > length - REC_SIZE) {
                    PyErr_SetString(PyExc_ValueError, "compact_scan: a torn record (the copy moved under it)");
                    goto done;
                }
                PyObject *key = PyBytes_FromStringAndSize(a + REC_SIZE, (Py_ssize_t)(klen - 1));
                if (!key) goto done;
                r[3] = (int64_t)(intptr_t)key; /* (released at the end) */
                if (!(flags & FLAG_ABORTED)) { /* an aborted record is no key's latest: it goes */
                    index = PyLong_FromSsize_t(n - 1);
                    if (!index || PyDict_SetItem(latest, key, index) < 0) goto done;
                    Py_CLEAR(index);
                }
            }
        }
        p += length;
    }
    kept = PyBytes_FromStringAndSize(NULL, n * 3 * (Py_ssize_t)sizeof(int64_t));
    if (!kept) goto done;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(kept);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t *r = recs + 4 * i;
        int goes = 0;
        if (compact) {
            const char *a = mem + r[0];
            uint32_t flags = U32(a + REC_FLAGS);
            if (flags & FLAG_ABORTED) {
                goes = 1;
            } else if (r[3]) {
                PyObject *at = PyDict_GetItemWithError(latest, (PyObject *)(intptr_t)r[3]);
                if (!at && PyErr_Occurred()) goto done;
                goes = !at || PyLong_AsSsize_t(at) != i ||
                       ((flags & FLAG_NULL_VALUE) && wall - (long long)U64(a + REC_ENQ_NS) > delete_ns);
            }
        }
        if (goes) {
            removed++;
        } else {
            memcpy(out + 3 * k, r, 3 * sizeof(int64_t));
            k++;
        }
    }
    if (_PyBytes_Resize(&kept, k * 3 * (Py_ssize_t)sizeof(int64_t)) < 0) goto done;
    result = Py_BuildValue("(Nn)", kept, removed);
    kept = NULL;
done:
    if (recs) {
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF((PyObject *)(intptr_t)recs[4 * i + 3]);
        PyMem_Free(recs);
    }
    Py_XDECREF(index);
    Py_XDECREF(latest);
    Py_XDECREF(kept);
    PyBuffer_Release(&view);
    return result;
}

/* ---- a stream partition's bulk append from Arrow buffers: the mirror of read_columns.
 *
 * A chunk is (n, value offsets, values, key offsets, keys, key validity, header offsets,
 * headers[, value validity[, anything]]): Arrow's binary layout with int32 offsets (indexes
 * into their data buffer, not necessarily from 0) -- read_columns' first nine fields, or the
 * buffers of a pyarrow batch's columns. Key offsets None: no keys; key validity None: every
 * key there; header offsets None: no headers (the header bytes are the encoded headers, as
 * stored); value validity None (or left out): every value there, else a value not there is
 * a tombstone (stored with FLAG_NULL_VALUE, no bytes).
 * Every buffer is checked before a byte is read from it. The appender (Partition.
 * append_columns) holds the partition's lock around columns_end and write_columns, as the
 * reader does around read_columns; these functions never take it. */

enum { CB_VO, CB_VD, CB_KO, CB_KD, CB_KV, CB_HO, CB_HD, CB_VV, CB_N };
#define CB_REQUIRED CB_VV /* the fields a chunk must have; the value validity may be left out */

typedef struct {
    Py_ssize_t n;
    Py_buffer b[CB_N]; /* b[i].obj == NULL: the field was None */
} Chunk;

static void chunks_free(Chunk *cs, Py_ssize_t k) {
    for (Py_ssize_t j = 0; j < k; j++)
        for (int i = 0; i < CB_N; i++)
            if (cs[j].b[i].obj) PyBuffer_Release(&cs[j].b[i]);
    PyMem_Free(cs);
}

static inline int32_t off_at(const Py_buffer *b, Py_ssize_t i) {
    int32_t v;
    memcpy(&v, (const char *)b->buf + 4 * i, 4);
    return v;
}

/* Are the offsets of a binary column sound: n + 1 of them, non-decreasing, inside data? */
static int offsets_ok(const Py_buffer *o, const Py_buffer *d, Py_ssize_t n) {
    if (o->len < 4 * (n + 1) || !d->obj) return 0;
    int32_t prev = off_at(o, 0);
    if (prev < 0) return 0;
    for (Py_ssize_t i = 1; i <= n; i++) {
        int32_t v = off_at(o, i);
        if (v < prev) return 0;
        prev = v;
    }
    return prev <= d->len;
}

/* The chunks of a list, their buffers held and checked; NULL with an exception set. */
static Chunk *chunks_get(PyObject *list, Py_ssize_t *count) {
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "chunks must be a list of (n, value offsets, values, key offsets, keys, "
                                         "key validity, header offsets, headers) tuples");
        return NULL;
    }
    Py_ssize_t k = PyList_GET_SIZE(list);
    Chunk *cs = PyMem_Calloc(k ? k : 1, sizeof(Chunk));
    if (!cs) return (Chunk *)PyErr_NoMemory();
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *t = PyList_GET_ITEM(list, j);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1 + CB_REQUIRED) {
            chunks_free(cs, j);
            PyErr_SetString(PyExc_TypeError, "a chunk is a tuple (n, value offsets, values, key offsets, keys, "
                                             "key validity, header offsets, headers)");
            return NULL;
        }
        Chunk *c = &cs[j];
        c->n = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 0));
        if (c->n < 0) {
            chunks_free(cs, j + 1);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a chunk's record count is negative");
            return NULL;
        }
        for (int i = 0; i < CB_N && 1 + i < PyTuple_GET_SIZE(t); i++) {
            PyObject *o = PyTuple_GET_ITEM(t, 1 + i);
            if (o != Py_None && PyObject_GetBuffer(o, &c->b[i], PyBUF_SIMPLE) < 0) {
                chunks_free(cs, j + 1);
                return NULL;
            }
        }
        Py_ssize_t n = c->n;
        const char *bad = NULL;
        if (!c->b[CB_VO].obj || !offsets_ok(&c->b[CB_VO], &c->b[CB_VD], n))
            bad = "value offsets";
        else if (c->b[CB_KO].obj && !offsets_ok(&c->b[CB_KO], &c->b[CB_KD], n))
            bad = "key offsets";
        else if (c->b[CB_KV].obj && (!c->b[CB_KO].obj || c->b[CB_KV].len < (n + 7) / 8))
            bad = "key validity";
        else if (c->b[CB_HO].obj && !offsets_ok(&c->b[CB_HO], &c->b[CB_HD], n))
            bad = "header offsets";
        else if (c->b[CB_VV].obj && c->b[CB_VV].len < (n + 7) / 8)
            bad = "value validity";
        if (bad) {
            chunks_free(cs, j + 1);
            PyErr_Format(PyExc_ValueError, "chunk %zd: its %s do not fit its %zd records", j, bad, n);
            return NULL;
        }
    }
    *count = k;
    return cs;
}

/* Record i of a chunk: its key (has_key 0: none), encoded headers and value (has_value 0:
 * a tombstone, no bytes). */
typedef struct {
    const char *k, *h, *v;
    uint32_t kl, hl, vl;
    int has_key, has_value;
} Row;

static inline void row_of(const Chunk *c, Py_ssize_t i, Row *r) {
    const Py_buffer *b = c->b;
    int32_t a = off_at(&b[CB_VO], i);
    r->has_value = !b[CB_VV].obj || (((const unsigned char *)b[CB_VV].buf)[i >> 3] >> (i & 7)) & 1;
    r->v = (const char *)b[CB_VD].buf + a;
    r->vl = r->has_value ? (uint32_t)(off_at(&b[CB_VO], i + 1) - a) : 0;
    r->has_key = b[CB_KO].obj && (!b[CB_KV].obj || (((const unsigned char *)b[CB_KV].buf)[i >> 3] >> (i & 7)) & 1);
    r->kl = 0;
    r->k = NULL;
    if (r->has_key) {
        a = off_at(&b[CB_KO], i);
        r->k = (const char *)b[CB_KD].buf + a;
        r->kl = (uint32_t)(off_at(&b[CB_KO], i + 1) - a);
    }
    r->hl = 0;
    r->h = NULL;
    if (b[CB_HO].obj) {
        a = off_at(&b[CB_HO], i);
        r->h = (const char *)b[CB_HD].buf + a;
        r->hl = (uint32_t)(off_at(&b[CB_HO], i + 1) - a);
    }
}

static inline uint64_t row_size(const Row *r) {
    return rec_size((uint64_t)r->kl + r->hl, r->vl);
}

/* columns_check(chunks) -> (records, their bytes in a ring (aligned sizes, no pads), the
 * largest record's key + headers + value): every buffer checked (ValueError). */
static PyObject *fast_columns_check(PyObject *self, PyObject *list) {
    Py_ssize_t k;
    Chunk *cs = chunks_get(list, &k);
    if (!cs) return NULL;
    uint64_t total = 0, biggest = 0;
    Py_ssize_t n = 0;
    Row r;
    for (Py_ssize_t j = 0; j < k; j++) {
        for (Py_ssize_t i = 0; i < cs[j].n; i++) {
            row_of(&cs[j], i, &r);
            uint64_t payload = (uint64_t)r.kl + r.hl + r.vl;
            if (payload > biggest) biggest = payload;
            total += row_size(&r);
        }
        n += cs[j].n;
    }
    chunks_free(cs, k);
    return Py_BuildValue("(nKK)", n, (unsigned long long)total, (unsigned long long)biggest);
}

/* Where the records go from ring position pos on: each at pos, or at the next lap when it
 * would straddle the end (as layout.place); returns the position after the last. */
static uint64_t chunks_end(const Chunk *cs, Py_ssize_t k, uint64_t pos, uint64_t cap) {
    Row r;
    for (Py_ssize_t j = 0; j < k; j++)
        for (Py_ssize_t i = 0; i < cs[j].n; i++) {
            row_of(&cs[j], i, &r);
            uint64_t size = row_size(&r), rem = cap - pos % cap;
            pos += (size > rem ? rem : 0) + size;
        }
    return pos;
}

/* columns_end(chunks, start, cap) -> the ring position after the last record appended at start. */
static PyObject *fast_columns_end(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[2];
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "columns_end(chunks, start, cap)");
        return NULL;
    }
    if (parse_u64s(args + 1, 2, v) < 0) return NULL;
    if (v[1] < REC_SIZE) {
        PyErr_SetString(PyExc_ValueError, "columns_end: the ring is smaller than a record");
        return NULL;
    }
    Py_ssize_t k;
    Chunk *cs = chunks_get(args[0], &k);
    if (!cs) return NULL;
    uint64_t end = chunks_end(cs, k, v[0], v[1]);
    chunks_free(cs, k);
    return PyLong_FromUnsignedLongLong(end);
}

/* columns_log(chunks, first_offset, now_ns, txn_id or None, batch) -> the log entries of
 * the records (a stream record's PUT entry each: dmsq.stream_entry), offsets from
 * first_offset on; with txn_id, then the publish note of (txn_id, batch) at the last one's
 * offset (dmsq.publish_entry). */
static PyObject *fast_columns_log(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[2], batch = 0;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "columns_log(chunks, first_offset, now_ns, txn_id, batch)");
        return NULL;
    }
    if (parse_u64s(args + 1, 2, v) < 0) return NULL;
    PyObject *txn = args[3];
    if (txn != Py_None) {
        if (!PyBytes_Check(txn) || PyBytes_GET_SIZE(txn) != 16) {
            PyErr_SetString(PyExc_ValueError, "columns_log: a publisher id is 16 bytes");
            return NULL;
        }
        if (parse_u64s(args + 4, 1, &batch) < 0) return NULL;
    }
    Py_ssize_t k;
    Chunk *cs = chunks_get(args[0], &k);
    if (!cs) return NULL;
    Row r;
    uint64_t bytes = 0, count = 0;
    for (Py_ssize_t j = 0; j < k; j++)
        for (Py_ssize_t i = 0; i < cs[j].n; i++, count++) {
            row_of(&cs[j], i, &r);
            bytes += LOG_HEAD + 4 + (uint64_t)r.kl + r.hl + r.vl;
        }
    if (txn != Py_None && count) bytes += LOG_HEAD + PUBLISH_BODY + 4;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bytes);
    if (!out) {
        chunks_free(cs, k);
        return NULL;
    }
    unsigned char *e = (unsigned char *)PyBytes_AS_STRING(out);
    uint64_t offset = v[0], now = v[1];
    for (Py_ssize_t j = 0; j < k; j++)
        for (Py_ssize_t i = 0; i < cs[j].n; i++, offset++) {
            row_of(&cs[j], i, &r);
            unsigned char *p = e + LOG_HEAD;
            if (r.hl) memcpy(p, r.h, r.hl);
            if (r.kl) memcpy(p + r.hl, r.k, r.kl);
            memcpy(p + r.hl + r.kl, r.v, r.vl);
            uint64_t attempt = (r.has_key ? (uint64_t)r.kl + 1 : 0) | (r.has_value ? 0 : LOG_NULL_VALUE);
            e += log_entry(e, LOG_PUT, r.hl, (uint64_t)r.kl + r.vl, attempt, offset, now);
        }
    if (txn != Py_None && count) {
        memcpy(e + LOG_HEAD, PyBytes_AS_STRING(txn), 16);
        memcpy(e + LOG_HEAD + 16, &batch, 8);
        log_entry(e, LOG_PUBLISH, 0, PUBLISH_BODY, 0, offset - 1, now);
    }
    chunks_free(cs, k);
    return out;
}

/* write_columns(buffer, base, cap, index_off, slots, stride, start, first_offset, now_ns,
 *               chunks) -> the position after the last record
 *   The records written from ring position start on (a pad record where one would
 *   straddle the end of the lap), offsets from first_offset, every stride-th offset's
 *   position in the sparse index (slots words at index_off): as Partition._write writes
 *   them. The caller holds the lock, has made the room, and commits (stores the tail). */
static PyObject *fast_write_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[8];
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "write_columns(buffer, base, cap, index_off, slots, stride, start, first_offset, now_ns, chunks)");
        return NULL;
    }
    if (parse_u64s(args + 1, 8, v) < 0) return NULL;
    uint64_t base = v[0], cap = v[1], index_off = v[2], slots = v[3], stride = v[4], pos = v[5], offset = v[6];
    uint64_t now = v[7];
    Py_ssize_t k;
    Chunk *cs = chunks_get(args[9], &k);
    if (!cs) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) {
        chunks_free(cs, k);
        return NULL;
    }
    if (cap < REC_SIZE || cap % 8 || base % 8 || base + cap > (uint64_t)view.len || !slots || !stride ||
        index_off % 8 || index_off + 8 * slots > base) {
        PyBuffer_Release(&view);
        chunks_free(cs, k);
        PyErr_SetString(PyExc_ValueError, "write_columns: the ring or its index is outside the buffer");
        return NULL;
    }
    char *mem = (char *)view.buf;
    Row r;
    for (Py_ssize_t j = 0; j < k; j++)
        for (Py_ssize_t i = 0; i < cs[j].n; i++, offset++) {
            row_of(&cs[j], i, &r);
            uint64_t size = row_size(&r);
            pos = placed(mem, base, cap, pos, size);
            char *a = mem + base + pos % cap;
            U64(a + REC_STATUS) = ST_READY;
            U32(a + REC_LENGTH) = (uint32_t)size;
            U32(a + REC_BODY_LEN) = r.vl;
            U32(a + REC_HDR_LEN) = r.kl + r.hl;
            U32(a + REC_FLAGS) = r.has_value ? 0 : FLAG_NULL_VALUE;
            U64(a + REC_MSG_ID) = offset;
            U64(a + REC_ENQ_NS) = now;
            U64(a + REC_DEADLINE) = r.has_key ? (uint64_t)r.kl + 1 : 0; /* a stream record: its key's length + 1 */
            char *b = a + REC_SIZE;
            if (r.kl) memcpy(b, r.k, r.kl);
            if (r.hl) memcpy(b + r.kl, r.h, r.hl);
            memcpy(b + r.kl + r.hl, r.v, r.vl);
            if (offset % stride == 0) U64(mem + index_off + 8 * ((offset / stride) % slots)) = pos;
            pos += size;
        }
    PyBuffer_Release(&view);
    chunks_free(cs, k);
    return PyLong_FromUnsignedLongLong(pos);
}

/* ring_drop(buffer, base, cap, head, tail, need, limit) -> (new head, records dropped, the
 *   new earliest offset or -1), or None: the records an append into a stream partition drops so
 *   that its head reaches position need, as Partition._room's walk finds them: from head on,
 *   each record until the position after it is at or past need (a pad there stays); the
 *   earliest is the first record kept (-1 and the head at tail when none is). None when one
 *   to drop has an offset at or past limit (retention="block": a group still needs it). The
 *   caller holds the lock. */
static PyObject *fast_ring_drop(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t v[6];
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "ring_drop(buffer, base, cap, head, tail, need, limit)");
        return NULL;
    }
    if (parse_u64s(args + 1, 6, v) < 0) return NULL;
    uint64_t base = v[0], cap = v[1], pos = v[2], tail = v[3], need = v[4], limit = v[5];
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    if (cap < REC_SIZE || cap % 8 || base % 8 || base + cap > (uint64_t)view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "ring_drop: the ring is outside the buffer");
        return NULL;
    }
    const char *mem = (const char *)view.buf;
    uint64_t head = pos, dropped = 0;
    long long earliest = -1;
    while (pos < tail) {
        uint64_t rem = cap - pos % cap;
        if (rem < REC_SIZE) { /* too little of the lap left for a record: the next lap */
            pos += rem;
            if (pos >= tail) break;
        }
        const char *a = mem + base + pos % cap;
        uint32_t length = U32(a + REC_LENGTH);
        int pad = (U64(a + REC_STATUS) & 0xFF) == ST_PAD;
        if (length < REC_SIZE) { /* never under the lock: stop rather than loop */
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "ring_drop: a record shorter than its header");
            return NULL;
        }
        if (head >= need && !pad) {
            earliest = (long long)U64(a + REC_MSG_ID);
            break;
        }
        if (head < need) {
            if (!pad) {
                if (U64(a + REC_MSG_ID) >= limit) {
                    PyBuffer_Release(&view);
                    Py_RETURN_NONE;
                }
                dropped++;
            }
            head = pos + length;
        }
        pos += length;
    }
    PyBuffer_Release(&view);
    if (earliest < 0) head = tail;
    return Py_BuildValue("(KKL)", (unsigned long long)head, (unsigned long long)dropped, earliest);
}

/* MurmurHash2 as Kafka's Java client has it (Utils.murmur2: seed 0x9747b28c, little-endian
 * words); partitioner.murmur2_python is the reference, and a test holds the two equal. */
static uint32_t murmur2_of(const unsigned char *p, size_t n) {
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)n;
    for (; n >= 4; p += 4, n -= 4) {
        uint32_t k = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h = h * m ^ k;
    }
    switch (n) {
    case 3: h ^= (uint32_t)p[2] << 16; /* fall through */
    case 2: h ^= (uint32_t)p[1] << 8;  /* fall through */
    case 1: h ^= p[0]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    return h ^ h >> 15;
}

/* murmur2(bytes-like) -> int: a key's hash, a signed 32-bit int as Java's (partitioner.murmur2). */
/* serve_own(on) -> the previous setting: see ``serving`` (this thread only). */
static PyObject *fast_serve_own(PyObject *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    int was = serving;
    serving = on;
    return PyBool_FromLong(was);
}

static PyObject *fast_murmur2(PyObject *self, PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t h = murmur2_of((const unsigned char *)v.buf, (size_t)v.len);
    PyBuffer_Release(&v);
    return PyLong_FromLong((long)(int32_t)h);
}

/* key_partitions(key offsets, keys, key validity or None, n, partitions, own) -> n int32:
 *   each record's partition by its key, Kafka's default partitioner (murmur2 & 0x7fffffff,
 *   modulo partitions) as partitioner.partition_of; own for a record without a key (a sink's
 *   routing, in bulk). */
static PyObject *fast_key_partitions(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "key_partitions(key offsets, keys, key validity, n, partitions, own)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[3]), parts = PyLong_AsSsize_t(args[4]), own = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (n < 0 || parts < 1 || own < 0 || own >= parts) {
        PyErr_SetString(PyExc_ValueError, "key_partitions: n >= 0, partitions >= 1, 0 <= own < partitions");
        return NULL;
    }
    Chunk c; /* the keys of a chunk, checked as chunks_get checks them */
    memset(&c, 0, sizeof c);
    c.n = n;
    int ok = 1;
    for (int i = CB_KO; i <= CB_KV && ok; i++) {
        PyObject *o = args[i - CB_KO];
        if (o != Py_None && PyObject_GetBuffer(o, &c.b[i], PyBUF_SIMPLE) < 0) ok = 0;
    }
    if (ok && (!c.b[CB_KO].obj || !offsets_ok(&c.b[CB_KO], &c.b[CB_KD], n) ||
               (c.b[CB_KV].obj && c.b[CB_KV].len < (n + 7) / 8))) {
        PyErr_Format(PyExc_ValueError, "key_partitions: the key offsets or validity do not fit %zd records", n);
        ok = 0;
    }
    PyObject *out = ok ? PyBytes_FromStringAndSize(NULL, 4 * n) : NULL;
    if (out) {
        char *o = PyBytes_AS_STRING(out);
        const unsigned char *valid = c.b[CB_KV].obj ? (const unsigned char *)c.b[CB_KV].buf : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t p = (int32_t)own;
            if (!valid || (valid[i >> 3] >> (i & 7)) & 1) {
                int32_t a = off_at(&c.b[CB_KO], i);
                p = (int32_t)((murmur2_of((const unsigned char *)c.b[CB_KD].buf + a,
                                          (size_t)(off_at(&c.b[CB_KO], i + 1) - a)) & 0x7fffffffu) % (uint32_t)parts);
            }
            memcpy(o + 4 * i, &p, 4);
        }
    }
    for (int i = 0; i < CB_N; i++)
        if (c.b[i].obj) PyBuffer_Release(&c.b[i]);
    return out;
}

/* ---------------------------------------------------------------- a queue's or stream's doorbell semaphore */

/* posix_ipc's acquire runs the Python signal handlers when its wait is interrupted and then
 * raises SignalError in place of what a handler raised (all but KeyboardInterrupt): an alarm's
 * TimeoutError, Celery's SoftTimeLimitExceeded, lost inside a blocking get. This one lets a
 * handler's exception through, as time.sleep does. */
typedef struct {
    PyObject_HEAD
    sem_t *sem;
    PyObject *name;
} Sem;

static void sem_dealloc(Sem *self) {
    if (self->sem) sem_close(self->sem);
    Py_XDECREF(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *sem_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *name;
    if (!PyArg_ParseTuple(args, "U:Sem", &name)) return NULL;
    const char *cname = PyUnicode_AsUTF8(name);
    if (!cname) return NULL;
    sem_t *sem = sem_open(cname, 0);
    if (sem == SEM_FAILED) return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, name);
    Sem *self = (Sem *)type->tp_alloc(type, 0);
    if (!self) {
        sem_close(sem);
        return NULL;
    }
    self->sem = sem;
    Py_INCREF(name);
    self->name = name;
    return (PyObject *)self;
}

static int sem_check(Sem *self) {
    if (self->sem) return 0;
    PyErr_Format(PyExc_ValueError, "semaphore %U is closed", self->name);
    return -1;
}

/* wait(timeout_ns) -> True when taken, False when the time passed or a signal's handlers ran
 * and returned; what a handler raises, raises here. */
static PyObject *sem_wait_ns(Sem *self, PyObject *arg) {
    long long ns = PyLong_AsLongLong(arg);
    if (ns == -1 && PyErr_Occurred()) return NULL;
    if (sem_check(self)) return NULL;
    if (ns < 0) ns = 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t until = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec + (uint64_t)ns;
    ts.tv_sec = (time_t)(until / 1000000000ULL);
    ts.tv_nsec = (long)(until % 1000000000ULL);
    int rc, err;
    Py_BEGIN_ALLOW_THREADS
    rc = sem_clockwait(self->sem, CLOCK_MONOTONIC, &ts);
    err = errno;
    Py_END_ALLOW_THREADS
    if (rc == 0) Py_RETURN_TRUE;
    if (err == EINTR) {
        if (PyErr_CheckSignals() < 0) return NULL;
        Py_RETURN_FALSE;
    }
    if (err == ETIMEDOUT) Py_RETURN_FALSE;
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

static PyObject *sem_release(Sem *self, PyObject *Py_UNUSED(ignored)) {
    if (sem_check(self)) return NULL;
    if (sem_post(self->sem) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *sem_close_(Sem *self, PyObject *Py_UNUSED(ignored)) {
    if (self->sem) {
        sem_close(self->sem);
        self->sem = NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *sem_value(Sem *self, void *Py_UNUSED(closure)) {
    int v;
    if (sem_check(self)) return NULL;
    if (sem_getvalue(self->sem, &v) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(v);
}

static PyMethodDef sem_methods[] = {
    {"wait", (PyCFunction)sem_wait_ns, METH_O, "wait(timeout_ns) -> bool: take one, or False once the time passed"},
    {"release", (PyCFunction)sem_release, METH_NOARGS, "post one"},
    {"close", (PyCFunction)sem_close_, METH_NOARGS, "close this process's handle (the name stays)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef sem_members[] = {
    {"name", T_OBJECT, offsetof(Sem, name), READONLY, "the semaphore's name"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef sem_getset[] = {
    {"value", (getter)sem_value, NULL, "the semaphore's count now", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SemType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmq.engine._fast.Sem",
    .tp_basicsize = sizeof(Sem),
    .tp_dealloc = (destructor)sem_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sem(name): an existing named semaphore, waited on with signal handlers' exceptions let through",
    .tp_methods = sem_methods,
    .tp_members = sem_members,
    .tp_getset = sem_getset,
    .tp_new = sem_new,
};

/* ---- the C API (_fast_api.h): these paths for the other extensions of this process */
static int64_t api_put(char *seg, uint64_t base, uint64_t cap, const char *body, uint64_t bl, const char *hraw,
                       uint64_t hl, uint64_t enq, long wal_fd, uint64_t wal_gen) {
    uint64_t unfinished, posts; /* (no fill without W_FILL: one post at most, the result's bit) */
    return put_core(seg, base, cap, body, bl, hraw, hl, enq, wal_fd, wal_gen, 0, &unfinished, &posts);
}

static int api_put_many(char *seg, uint64_t base, uint64_t cap, Py_ssize_t n, const char *const *bodies,
                        const uint64_t *lengths, uint64_t max_message_bytes, uint64_t enq, uint64_t *first,
                        uint64_t *posts) {
    if (!n) return R_FALLBACK;
    for (Py_ssize_t i = 0; i < n; i++)
        if (lengths[i] > max_message_bytes) return R_FALLBACK;
    return put_many_core(seg, base, cap, n, bodies, lengths, NULL, NULL, 0, enq, first, posts);
}

static PyObject *api_take_many(PyObject *q, char *seg, uint64_t base, uint64_t cap, uint64_t slot, uint64_t vis_ns,
                               uint64_t max_deliveries, uint64_t now, uint64_t max_messages, uint64_t max_bytes) {
    if (!delivery_class) return PyLong_FromLong(R_FALLBACK);
    return take_many_core(q, seg, base, cap, slot, vis_ns, max_deliveries, now, max_messages, max_bytes, 0, NULL, 0);
}

static int api_serve_own(int on) {
    int was = serving;
    serving = on;
    return was;
}

static ShmqFastAPI fast_api = {
    .version = SHMQ_FAST_API_VERSION,
    .r_busy = R_BUSY,
    .r_ownerdead = R_OWNERDEAD,
    .r_fallback = R_FALLBACK,
    .r_expired = R_EXPIRED,
    .r_deleted = R_DELETED,
    .r_empty = R_EMPTY,
    .r_full = R_FULL,
    .r_oserror = R_OSERROR,
    .put = api_put,
    .put_many = api_put_many,
    .take_many = api_take_many,
    .ack = ack_core,
    .ack_many = ack_many_core,
    .serve_own = api_serve_own,
    .delivery_base = &DeliveryBaseType,
};

static PyMethodDef methods[] = {
    {"put", (PyCFunction)(void (*)(void))fast_put, METH_FASTCALL, "the put fast path"},
    {"take", (PyCFunction)(void (*)(void))fast_take, METH_FASTCALL, "the get fast path"},
    {"take_many", (PyCFunction)(void (*)(void))fast_take_many, METH_FASTCALL, "the get_many fast path"},
    {"ack", (PyCFunction)(void (*)(void))fast_ack, METH_FASTCALL, "the ack fast path"},
    {"take_next", (PyCFunction)(void (*)(void))fast_take_next, METH_FASTCALL,
     "the consume loop's step: ack the previous delivery and take the next, one lock hold"},
    {"ack_many", (PyCFunction)(void (*)(void))fast_ack_many, METH_FASTCALL, "the ack_many fast path"},
    {"set_delivery_class", (PyCFunction)fast_set_delivery_class, METH_O, "the class takes build"},
    {"put_many", (PyCFunction)(void (*)(void))fast_put_many, METH_FASTCALL, "the put_many fast path"},
    {"nack_many", (PyCFunction)(void (*)(void))fast_nack_many, METH_FASTCALL, "the nack_many fast path"},
    {"reserve", (PyCFunction)(void (*)(void))fast_reserve, METH_FASTCALL, "a reservation claimed as a fill (lock let go)"},
    {"publish", (PyCFunction)(void (*)(void))fast_publish, METH_FASTCALL, "a fill's end (takes the lock)"},
    {"read_columns", (PyCFunction)(void (*)(void))fast_read_columns, METH_FASTCALL,
     "a stream partition's records as Arrow buffers"},
    {"compact_scan", (PyCFunction)(void (*)(void))fast_compact_scan, METH_FASTCALL,
     "a compaction's scan of a copied partition run: the records that stay"},
    {"columns_check", (PyCFunction)fast_columns_check, METH_O, "check chunks of Arrow buffers: records, bytes, largest"},
    {"columns_end", (PyCFunction)(void (*)(void))fast_columns_end, METH_FASTCALL,
     "the ring position after chunks appended at a position"},
    {"columns_log", (PyCFunction)(void (*)(void))fast_columns_log, METH_FASTCALL,
     "the log entries of chunks appended to a stream partition"},
    {"write_columns", (PyCFunction)(void (*)(void))fast_write_columns, METH_FASTCALL,
     "chunks of Arrow buffers written into a stream partition's ring (lock held)"},
    {"ring_drop", (PyCFunction)(void (*)(void))fast_ring_drop, METH_FASTCALL,
     "where a stream partition's head goes for an append, and the records it drops (lock held)"},
    {"key_partitions", (PyCFunction)(void (*)(void))fast_key_partitions, METH_FASTCALL,
     "each record's partition by its key, as Kafka's default partitioner"},
    {"murmur2", (PyCFunction)fast_murmur2, METH_O, "a key's murmur2 hash, as Kafka's Java client's"},
    {"serve_own", (PyCFunction)fast_serve_own, METH_O,
     "serve_own(on) -> previous: this thread serves its own doorbells' waiters (no post owed to them)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "shmq.engine._fast", "The engine's hot paths in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fast(void) {
    crc_init();
    if (PyType_Ready(&LoanType) < 0 || PyType_Ready(&DeliveryBaseType) < 0 || PyType_Ready(&SemType) < 0 ||
        PyType_Ready(&ReservationType) < 0 || PyType_Ready(&BatchType) < 0)
        return NULL;
    if (!(s_segp = PyUnicode_InternFromString("_segp")) || !(s_base = PyUnicode_InternFromString("_base")) ||
        !(s_cap = PyUnicode_InternFromString("_cap")) || !(s_slot = PyUnicode_InternFromString("_slot")) ||
        !(s_mm = PyUnicode_InternFromString("_mm")) || !(s_ne = PyUnicode_InternFromString("_ne")) ||
        !(s_lockp = PyUnicode_InternFromString("_lockp")) ||
        !(s_finish_fill = PyUnicode_InternFromString("_finish_fill")) ||
        !(s_repair = PyUnicode_InternFromString("_repair_held_lock")) ||
        !(s_release = PyUnicode_InternFromString("release")) || !(s_enter = PyUnicode_InternFromString("__enter__")) ||
        !(s_exit = PyUnicode_InternFromString("__exit__")) || !(s_name = PyUnicode_InternFromString("name")) ||
        !(s_pace_idle = PyUnicode_InternFromString("_pace_idle")) ||
        !(s_reservation = PyUnicode_InternFromString("_reservation")) || !(s_id = PyUnicode_InternFromString("id")))
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ReservationType);
    if (PyModule_AddObject(m, "Reservation", (PyObject *)&ReservationType) < 0) {
        Py_DECREF(&ReservationType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&BatchType);
    if (PyModule_AddObject(m, "Reservations", (PyObject *)&BatchType) < 0) {
        Py_DECREF(&BatchType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&LoanType);
    if (PyModule_AddObject(m, "Loan", (PyObject *)&LoanType) < 0) {
        Py_DECREF(&LoanType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&DeliveryBaseType);
    if (PyModule_AddObject(m, "DeliveryBase", (PyObject *)&DeliveryBaseType) < 0) {
        Py_DECREF(&DeliveryBaseType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&SemType);
    if (PyModule_AddObject(m, "Sem", (PyObject *)&SemType) < 0) {
        Py_DECREF(&SemType);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *api = PyCapsule_New(&fast_api, SHMQ_FAST_API_CAPSULE, NULL);
    if (!api || PyModule_AddObject(m, "_C_API", api) < 0) {
        Py_XDECREF(api);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "MUTEX_OFF", MUTEX_OFF) || PyModule_AddIntConstant(m, "HOT_OFF", HOT_W * 8) ||
        PyModule_AddIntConstant(m, "COUNTERS_OFF", COUNTERS_W * 8) ||
        PyModule_AddIntConstant(m, "REC_SIZE", REC_SIZE) || PyModule_AddIntConstant(m, "READY", ST_READY) ||
        PyModule_AddIntConstant(m, "LEASED", ST_LEASED) || PyModule_AddIntConstant(m, "ACKED", ST_ACKED) ||
        PyModule_AddIntConstant(m, "PAD", ST_PAD) || PyModule_AddIntConstant(m, "BUSY", R_BUSY) ||
        PyModule_AddIntConstant(m, "OWNERDEAD", R_OWNERDEAD) ||
        PyModule_AddIntConstant(m, "FALLBACK", R_FALLBACK) || PyModule_AddIntConstant(m, "EXPIRED", R_EXPIRED) ||
        PyModule_AddIntConstant(m, "DELETED", R_DELETED) || PyModule_AddIntConstant(m, "EMPTY", R_EMPTY) ||
        PyModule_AddIntConstant(m, "SLEEP", R_SLEEP) || PyModule_AddIntConstant(m, "FULL", R_FULL) || PyModule_AddIntConstant(m, "W_REGISTER", W_REGISTER) ||
        PyModule_AddIntConstant(m, "WAL_MAX_PAYLOAD", WAL_MAX_PAYLOAD) ||
        PyModule_AddIntConstant(m, "FILLING", ST_FILLING) ||
        PyModule_AddObject(m, "W_FILL", PyLong_FromUnsignedLongLong(W_FILL))) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
