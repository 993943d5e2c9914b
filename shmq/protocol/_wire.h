/* The DEADBEEF codec's C half (docs/PROTOCOL.md), sans-IO like frames.py: a frame's header read
 * and written, and the msgpack subset the plain requests and their replies use, read from a
 * byte range and written into a growable buffer. Header-only, included by the C extensions that
 * serve (shmq/server/_plain.c) or send (shmq/protocol/_wire.c, the clients' codec) the plain
 * requests. Its constants (the header's, the request types) are frames.py's: the generated _frames.h.
 *
 * Strategy: a reader never trusts its bytes: every read checks the room left and says no (0)
 * rather than guess, and the caller then leaves the frame to the Python codec, which says what
 * is wrong. A writer writes what Python's msgpack packer writes for the same values (the
 * smallest form of each int, bin for bytes, float64 for floats), so either side may encode
 * any frame: the tests hold the bytes equal.
 */
#ifndef SHMQ_WIRE_H
#define SHMQ_WIRE_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_frames.h"

/* ---- the header: magic u32, length u32, type u8, version u8, status u16, msg id u32; network order */
typedef struct {
    uint32_t magic, length, msg_id;
    uint8_t type, version;
    uint16_t status;
} WireHeader;

static inline uint32_t wire_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void wire_put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void wire_header(const uint8_t *p, WireHeader *h) {
    h->magic = wire_be32(p);
    h->length = wire_be32(p + 4);
    h->type = p[8];
    h->version = p[9];
    h->status = (uint16_t)(p[10] << 8 | p[11]);
    h->msg_id = wire_be32(p + 12);
}

/* ---- reading msgpack: a cursor over [p, end); each call moves it past what it read, or returns 0 */
typedef struct {
    const uint8_t *p, *end;
} MpIn;

static inline int mp_need(MpIn *in, size_t n) { return (size_t)(in->end - in->p) >= n; }

static inline uint64_t mp_be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* a map's or an array's count: fix, 16 or 32 */
static inline int mp_count(MpIn *in, uint8_t fix, uint8_t fixmask, uint8_t c16, uint64_t *n) {
    if (!mp_need(in, 1)) return 0;
    uint8_t b = *in->p;
    if ((b & ~fixmask) == fix) {
        *n = b & fixmask;
        in->p += 1;
        return 1;
    }
    int w = b == c16 ? 2 : b == (uint8_t)(c16 + 1) ? 4 : 0;
    if (!w || !mp_need(in, 1 + (size_t)w)) return 0;
    *n = mp_be(in->p + 1, w);
    in->p += 1 + w;
    return 1;
}

static inline int mp_map(MpIn *in, uint64_t *n) { return mp_count(in, 0x80, 0x0F, 0xDE, n); }
static inline int mp_array(MpIn *in, uint64_t *n) { return mp_count(in, 0x90, 0x0F, 0xDC, n); }

/* a str (its UTF-8 is the caller's to check) */
static inline int mp_str(MpIn *in, const char **s, uint64_t *n) {
    if (!mp_need(in, 1)) return 0;
    uint8_t b = *in->p;
    int w;
    if ((b & 0xE0) == 0xA0) {
        *n = b & 0x1F;
        w = 0;
    } else if (b >= 0xD9 && b <= 0xDB) {
        w = 1 << (b - 0xD9);
        if (!mp_need(in, 1 + (size_t)w)) return 0;
        *n = mp_be(in->p + 1, w);
    } else {
        return 0;
    }
    if (!mp_need(in, 1 + (size_t)w + *n)) return 0;
    *s = (const char *)in->p + 1 + w;
    in->p += 1 + w + *n;
    return 1;
}

static inline int mp_bin(MpIn *in, const char **s, uint64_t *n) {
    if (!mp_need(in, 1)) return 0;
    uint8_t b = *in->p;
    if (b < 0xC4 || b > 0xC6) return 0;
    int w = 1 << (b - 0xC4);
    if (!mp_need(in, 1 + (size_t)w)) return 0;
    *n = mp_be(in->p + 1, w);
    if (!mp_need(in, 1 + (size_t)w + *n)) return 0;
    *s = (const char *)in->p + 1 + w;
    in->p += 1 + w + *n;
    return 1;
}

/* an int of any width that is >= 0 (a negative one: 0, as anything else not read) */
static inline int mp_uint(MpIn *in, uint64_t *v) {
    if (!mp_need(in, 1)) return 0;
    uint8_t b = *in->p;
    if (b < 0x80) {
        *v = b;
        in->p += 1;
        return 1;
    }
    int w, sign = 0;
    if (b >= 0xCC && b <= 0xCF) w = 1 << (b - 0xCC);
    else if (b >= 0xD0 && b <= 0xD3) w = 1 << (b - 0xD0), sign = 1;
    else return 0;
    if (!mp_need(in, 1 + (size_t)w)) return 0;
    uint64_t x = mp_be(in->p + 1, w);
    if (sign && x >> (8 * w - 1)) return 0; /* negative */
    *v = x;
    in->p += 1 + w;
    return 1;
}

/* true or false: 1 and *v; else 0 */
static inline int mp_bool(MpIn *in, int *v) {
    if (!mp_need(in, 1) || (*in->p != 0xC2 && *in->p != 0xC3)) return 0;
    *v = *in->p == 0xC3;
    in->p += 1;
    return 1;
}

/* whether a str read is the key ``k`` */
static inline int mp_is(const char *s, uint64_t n, const char *k) { return n == strlen(k) && !memcmp(s, k, n); }

/* ---- writing msgpack into a growable buffer */
typedef struct {
    uint8_t *buf;
    size_t len, cap;
} MpOut;

static inline int mp_room(MpOut *o, size_t n) {
    if (o->len + n <= o->cap) return 1;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + n) cap *= 2;
    uint8_t *b = PyMem_Realloc(o->buf, cap);
    if (!b) {
        PyErr_NoMemory();
        return 0;
    }
    o->buf = b;
    o->cap = cap;
    return 1;
}

static inline void mp_raw(MpOut *o, const void *p, size_t n) { /* (room made) */
    memcpy(o->buf + o->len, p, n);
    o->len += n;
}

static inline void mp_bytes_be(MpOut *o, uint8_t tag, uint64_t v, int w) { /* (room made: 1 + w) */
    o->buf[o->len++] = tag;
    for (int i = w - 1; i >= 0; i--) o->buf[o->len++] = (uint8_t)(v >> (8 * i));
}

/* an int >= 0, as msgpack-python packs it: fixint, then uint8 .. uint64 */
static inline int mp_w_uint(MpOut *o, uint64_t v) {
    if (!mp_room(o, 9)) return 0;
    if (v < 0x80) o->buf[o->len++] = (uint8_t)v;
    else if (v <= 0xFF) mp_bytes_be(o, 0xCC, v, 1);
    else if (v <= 0xFFFF) mp_bytes_be(o, 0xCD, v, 2);
    else if (v <= 0xFFFFFFFFu) mp_bytes_be(o, 0xCE, v, 4);
    else mp_bytes_be(o, 0xCF, v, 8);
    return 1;
}

static inline int mp_w_count(MpOut *o, uint64_t n, uint8_t fix, uint8_t c16) {
    if (!mp_room(o, 5)) return 0;
    if (n < 16) o->buf[o->len++] = (uint8_t)(fix | n);
    else if (n <= 0xFFFF) mp_bytes_be(o, c16, n, 2);
    else mp_bytes_be(o, (uint8_t)(c16 + 1), n, 4);
    return 1;
}

static inline int mp_w_map(MpOut *o, uint64_t n) { return mp_w_count(o, n, 0x80, 0xDE); }
static inline int mp_w_array(MpOut *o, uint64_t n) { return mp_w_count(o, n, 0x90, 0xDC); }

/* a str of up to 31 bytes (the keys): fixstr */
static inline int mp_w_key(MpOut *o, const char *k) {
    size_t n = strlen(k);
    if (!mp_room(o, 1 + n)) return 0;
    o->buf[o->len++] = (uint8_t)(0xA0 | n);
    mp_raw(o, k, n);
    return 1;
}

/* a str of any length (str8 from 32 bytes: use_bin_type's packer) */
static inline int mp_w_str(MpOut *o, const char *s, size_t n) {
    if (!mp_room(o, 5 + n)) return 0;
    if (n < 32) o->buf[o->len++] = (uint8_t)(0xA0 | n);
    else if (n <= 0xFF) mp_bytes_be(o, 0xD9, n, 1);
    else if (n <= 0xFFFF) mp_bytes_be(o, 0xDA, n, 2);
    else mp_bytes_be(o, 0xDB, n, 4);
    mp_raw(o, s, n);
    return 1;
}

static inline int mp_w_bin(MpOut *o, const void *p, size_t n) {
    if (!mp_room(o, 5 + n)) return 0;
    if (n <= 0xFF) mp_bytes_be(o, 0xC4, n, 1);
    else if (n <= 0xFFFF) mp_bytes_be(o, 0xC5, n, 2);
    else mp_bytes_be(o, 0xC6, n, 4);
    mp_raw(o, p, n);
    return 1;
}

static inline int mp_w_double(MpOut *o, double d) {
    uint64_t v;
    memcpy(&v, &d, 8);
    if (!mp_room(o, 9)) return 0;
    mp_bytes_be(o, 0xCB, v, 8);
    return 1;
}

/* A frame's header at ``at`` (its payload, ``o->len - at - 16`` bytes, written after it). */
static inline void wire_w_header(MpOut *o, size_t at, uint8_t type, uint16_t status, uint32_t msg_id) {
    uint8_t *p = o->buf + at;
    wire_put32(p, WIRE_MAGIC);
    wire_put32(p + 4, (uint32_t)(o->len - at - WIRE_HEADER));
    p[8] = type;
    p[9] = WIRE_VERSION;
    p[10] = (uint8_t)(status >> 8);
    p[11] = (uint8_t)status;
    wire_put32(p + 12, msg_id);
}

/* Room for a header, whose place is returned (filled by wire_w_header once the payload is in). */
static inline int wire_w_open(MpOut *o, size_t *at) {
    if (!mp_room(o, WIRE_HEADER)) return 0;
    *at = o->len;
    o->len += WIRE_HEADER;
    return 1;
}

#endif
