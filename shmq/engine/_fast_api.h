/* The engine's hot paths as C calls, for another extension in this process (the server's
 * plain requests, shmq/server/_plain.c): a capsule, ``shmq.engine._fast._C_API``, holding this
 * table. Each call is the twin of the Python-visible one named beside it in _fast.c, with
 * bodies as pointers instead of bytes objects; the results and R_* codes are the same, and so
 * is everything they leave to the caller (posts owed, a repair after R_OWNERDEAD, the
 * Python path after R_FALLBACK or R_BUSY). The GIL is held on every call.
 */
#ifndef SHMQ_FAST_API_H
#define SHMQ_FAST_API_H

#include <Python.h>
#include <stdint.h>

#define SHMQ_FAST_API_VERSION 1
#define SHMQ_FAST_API_CAPSULE "shmq.engine._fast._C_API"

typedef struct {
    int version; /* SHMQ_FAST_API_VERSION */
    /* results other than success, R_* (_layout.h's enum shmq_ret, from layout.py's RETURNS) */
    int r_busy, r_ownerdead, r_fallback, r_expired, r_deleted, r_empty, r_full, r_oserror;
    /* put: msg_id << 1 | (1 if a consumer post is owed), or R_* (R_OSERROR: errno says why) */
    int64_t (*put)(char *seg, uint64_t base, uint64_t cap, const char *body, uint64_t bl, const char *hraw,
                   uint64_t hl, uint64_t enq, long wal_fd, uint64_t wal_gen);
    /* put_many of n bodies without headers (no log): 0 with *first (msg id) and *posts (owed), or R_* */
    int (*put_many)(char *seg, uint64_t base, uint64_t cap, Py_ssize_t n, const char *const *bodies,
                    const uint64_t *lengths, uint64_t max_message_bytes, uint64_t enq, uint64_t *first,
                    uint64_t *posts);
    /* take_many (leased, copied bodies): a list of at least one Delivery of ``q``, or an int R_* */
    PyObject *(*take_many)(PyObject *q, char *seg, uint64_t base, uint64_t cap, uint64_t slot, uint64_t vis_ns,
                           uint64_t max_deliveries, uint64_t now, uint64_t max_messages, uint64_t max_bytes);
    /* ack: 1 if a producer post is owed, else 0; or R_* (R_OSERROR: errno says why) */
    int (*ack)(char *seg, uint64_t base, uint64_t cap, uint64_t pos, uint64_t attempt, uint64_t msg_id, uint64_t now,
               long wal_fd, uint64_t wal_gen, uint64_t slot);
    /* ack_many of k (pos, attempt, msg_id) triples (no log): 0 with *acked, *post and the indices no longer
     * leased in bad[0 .. *nbad) (bad holds k), or R_* */
    int (*ack_many)(char *seg, uint64_t base, uint64_t cap, const uint64_t *triples, Py_ssize_t k, uint64_t now,
                    uint64_t slot, uint64_t *acked, int *post, Py_ssize_t *bad, Py_ssize_t *nbad);
    /* waits.serving's C side: this thread serves its own doorbells' waiters; returns the previous setting */
    int (*serve_own)(int on);
    /* the Delivery fields' struct type (deliveries are instances of a subclass) */
    PyTypeObject *delivery_base;
} ShmqFastAPI;

/* A delivery's fields, as _fast.c's DeliveryBase lays them out (the members the C calls read). */
typedef struct {
    PyObject_HEAD
    PyObject *id, *body, *attempt, *q, *pos, *hraw, *enq, *ext, *raw;
} ShmqDeliveryFields;

#endif
