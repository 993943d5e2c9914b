"""Byte layout of a queue segment, record encoding, and ring arithmetic: the one place
a byte offset is written (``_layout.h``, the C hot paths' copy, and ``Layout.java``, the JVM
stream reader's, are generated from it).

Strategy: everything here works on any writable buffer (a bytearray in the tests, the
mmap of a segment in production) and knows nothing of locks, processes or time, so
the arithmetic can be tested exhaustively on its own.

Positions are monotonic 64-bit byte counters; a position's offset in the ring is
``pos % capacity``. A record never straddles the end of the ring: when it would not
fit, the tail skips the rest of the lap (marked by a PAD record, or left implicit
when less than a record header remains). Every record starts on an 8-byte boundary,
so its first word, the *status word*, is written by one aligned 8-byte store: the
commit point of every change to a message's state.
"""

import re
import struct

from ...model.checks import MAX_PARTITIONS  # (a stream's groups keep a word per partition below it)

__all__ = [
    "MAGIC", "LAYOUT_VERSION", "ALIGN", "REC", "REC_SIZE",
    "READY", "LEASED", "ACKED", "PAD", "DELAYED", "FILLING", "STATE_NAMES", "NO_HOLDER", "NEVER",
    "DURABILITY", "DURABILITY_NAMES",
    "STATIC", "STATIC_OFF", "MUTEX_OFF", "FILL_OFF", "FILL_MIN", "I_FILL", "WRAP_OFF", "I_WRAP", "LARGE", "WINDOW_MIN",
    "WINDOW_RECORDS", "UNWRAP_GAP", "SPILL_WAIT_NS", "FILL_STALE_NS", "HOT", "HOT_OFF", "HOT_FIELDS", "COUNTERS", "COUNTERS_OFF",
    "COUNTER_FIELDS", "PROCS_OFF", "PROC", "PROC_SIZE", "WALCFG", "WALCFG_OFF", "WAL_WORDS_OFF", "TIMENS_OFF", "WORD",
    "REC_FIELDS", "REC_OFFSETS", "field_offsets", "R_STATUS", "R_LENGTH", "R_MSG_ID", "R_ENQ", "R_DEADLINE",
    "P_CWAIT", "P_PWAIT", "P_ACKED", "P_REDELIVERED", "P_BELLS", "P_CONSUMERS", "OPTS_LANES_OFF", "id_step", "proc_word",
    "RETURNS", "R_BUSY", "R_OWNERDEAD", "R_FALLBACK", "R_EXPIRED", "R_DELETED", "R_EMPTY", "R_SLEEP", "R_FULL",
    "R_OSERROR", "R_UNFINISHED",
    "WAL_NEVER", "WAL_ALWAYS", "WAL_BATCH", "WAL_SUSPENDED", "WAL_ALARM", "WAL_POLICY", "c_header",
    "java_layout",
    "OPTS", "OPTS_FIELDS", "OPTS_OFF", "XWORDS_OFF", "XWORD_FIELDS", "I_SPECIAL", "I_NEXT_TTL", "I_EXPIRED_TOTAL",
    "I_PRODUCER_TURNS", "I_CONSUMER_TURNS", "I_VOIDED", "LANE_SLEEPERS_OFF", "I_LANE_SLEEPERS", "I_BELLS", "I_ROOM",
    "LIFETIME_OFF", "I_LIFETIME", "I_LAST_USED", "LIFE_AUTO_DELETE", "LIFE_HAD_CONSUMER", "LIFE_EXPIRES_SHIFT",
    "LIFE_RENEW_NS", "life_renew_ns",
    "DEDUP", "DEDUP_SLOTS", "DEDUP_PROBES", "dedup_offset", "EXT", "EXT_MAGIC", "EXT_VERSION", "FLAG_EXT",
    "FLAG_WALK", "FLAG_TTL", "LEVEL_POS_OFF", "I_LEVEL_POS",
    "MAX_PRIORITIES", "MAX_GROUP_BYTES",
    "CHUNK_SHIFT", "CHUNK", "MEM_FIELDS", "MEM_SIZE", "BITMAP_BYTES", "MAX_RING_BYTES", "GIVE_BACK_GRACE_NS",
    "GIVE_BACK_BUDGET", "ROOM_LOOK", "MEM_OFF", "PART_MEM_OFF", "mem_words", "reuse_after", "POS_LIMIT",
    "align", "record_size", "sized", "status_word", "split_status", "skip_gap", "place", "segment_size", "data_offset",
]

MAGIC = b"SHMQ"
LAYOUT_VERSION = 6  # 2: the options block, the extra words, the dedup table, record extensions; 3: lanes, a cache
# line per process slot with its share of the counters; 4: the control words on a line per side; 5: memory taken
# chunk by chunk (the memory block and its bitmap), the process table after it; 6: fills (a large body written
# outside the lock, past the tail: the fill word and the FILLING state)
ALIGN = 8

# --- message states (low byte of the status word) ---------------------------------
READY = 1     # waiting to be delivered
LEASED = 2    # delivered, waiting for ack/nack; deadline = lease expiry
ACKED = 3     # settled (acked, dropped, dead-lettered, purged): space to reclaim
PAD = 4       # filler to the end of the lap; length = bytes skipped
DELAYED = 5   # nacked with a delay; deadline = when it becomes READY again
FILLING = 6   # past the tail, its body being written outside the lock by its holder (a fill: ``FILL_OFF``)
STATE_NAMES = {READY: "ready", LEASED: "leased", ACKED: "acked", PAD: "pad", DELAYED: "delayed", FILLING: "filling"}
NO_HOLDER = 0xFFFF
# durability mode, in the low byte of the static header's flags
DURABILITY = {"memory": 0, "snapshot": 1, "wal": 2}
DURABILITY_NAMES = {v: k for k, v in DURABILITY.items()}
NEVER = 2**64 - 1  # a deadline that never comes

# --- record header: 48 bytes -------------------------------------------------------
# status   u64  state | holder << 8 | attempt << 32   (the commit word)
# length   u32  whole record, header + headers + body + padding, a multiple of 8
# body_len u32
# hdr_len  u32  msgpack-encoded headers that follow the record header
# flags    u32  reserved (0): marks optional extension blocks of later versions
# msg_id   u64
# enq_ns   u64  wall-clock enqueue time, ns since the epoch
# deadline u64  monotonic ns: lease expiry (LEASED) or ready time (DELAYED)
REC = struct.Struct("<QIIIIQQQ")
REC_SIZE = REC.size  # 48
REC_FIELDS = ("status", "length", "body_len", "hdr_len", "flags", "msg_id", "enq_ns", "deadline")


def field_offsets(st: struct.Struct, names) -> dict:
    """Byte offset of each field of a little-endian struct, by name, in order."""
    codes = re.findall(r"\d*[a-zA-Z?]", st.format[1:])
    assert len(codes) == len(names), (st.format, names)
    return {n: struct.calcsize("<" + "".join(codes[:i])) for i, n in enumerate(names)}


REC_OFFSETS = field_offsets(REC, REC_FIELDS)
# the record's words, as indices from its first word (records are 8-aligned): the status
# word, the word whose low half is the length, and the three 64-bit fields at the end
R_STATUS, R_LENGTH, R_MSG_ID, R_ENQ, R_DEADLINE = (
    REC_OFFSETS[f] >> 3 for f in ("status", "length", "msg_id", "enq_ns", "deadline"))

# --- segment layout ------------------------------------------------------------------
# static header: magic, version, flags (low byte: durability), capacity, max_message_bytes, visibility_ns,
# max_deliveries (0 = unlimited), process slots, created_ns, data offset, name, dead-letter queue
STATIC = struct.Struct("<4sHHQQQQQQQ H128s H128s")
STATIC_OFF = 0
# write-ahead log config (durability "wal"), set by the broker that owns the data dir:
# generation (0: no log yet), fsync mode (0 never, 1 always, 2 batch), batch ms, directory
WALCFG = struct.Struct("<QIIH150s")
WALCFG_OFF = 328
# a queue's lifetime (``queues/lifetime.py``), in two words after the log config that segments of
# before held zero (zero: none of it, so no layout version was needed): ``lifetime``, flags in the low
# byte (LIFE_AUTO_DELETE: deleted when its last consumer goes, fixed at creation; LIFE_HAD_CONSUMER: it
# had one) and ``expires`` in ms above them (0: never); ``last_used``, the monotonic ns of its last
# declare, consumer change or take, from which ``expires`` counts. A take stores it only when it is a
# quarter of ``expires`` (LIFE_RENEW_NS at most) old, so a queue counts as unused only that much later
LIFETIME_OFF = 496
LIFE_AUTO_DELETE, LIFE_HAD_CONSUMER = 1, 2
LIFE_EXPIRES_SHIFT = 8
LIFE_RENEW_NS = 1_000_000_000


def life_renew_ns(expires_ms: int) -> int:
    """How stale a queue's ``last_used`` may be before a take stores it again."""
    return min(LIFE_RENEW_NS, expires_ms * 250_000)
MUTEX_OFF = 512
# the fill word, on the mutex's own line (read and written only under the lock, so it costs a put nothing):
# 0, or past the tail, the end of the records placed past it (fills: a put or reserve of FILL_MIN body bytes
# or more writes its body with the lock let go, its record FILLING; a put meanwhile goes after it, written
# whole). The tail moves over them in order as they are done (``ring.commit_fills``); a FILLING record whose
# holder died becomes a PAD. pthread_mutex_t takes 40 bytes (48 on aarch64): the word after it
FILL_OFF = MUTEX_OFF + 56
FILL_MIN = 32 * 1024  # body bytes from which a put or reserve of an unlogged queue fills outside the lock
# The window of a ring of large records (``ring.window``): a record of LARGE bytes or more (a record's, header
# included) appended past the window of its lap, while the lap's start has room for it before the head, starts
# the next lap there (an early wrap: a PAD to the lap's end), so that the memory the consumers just freed, still
# in the CPU's caches, is written again instead of the next, cold, stretch of the ring. The wrap word (on the
# mutex's line too) holds the last early wrap's pad position. A producer that then catches up with the head
# waits for it up to SPILL_WAIT_NS, then spills: its records continue in the head's next lap past that pad
# (UNWRAP_GAP after it, the pad's header kept whole), where the ring is free, so max_bytes still holds
WRAP_OFF = MUTEX_OFF + 48
LARGE = FILL_MIN
WINDOW_MIN = 4 << 20
WINDOW_RECORDS = 2  # the window holds this many records at least (4 MiB arrays: 1.1-1.2x iceoryx2 at 2, 0.8-0.9x at 4)
UNWRAP_GAP = 64
SPILL_WAIT_NS = 2_000_000
FILL_STALE_NS = 20_000_000  # a put that finds a fill this old (its put time) looks whether its holder lives
HOT_OFF = 576
# the control words, a cache line for each side (issue 21): what puts write, what takes and acks
# write, and the line both write, which every put also reads. A put reads the consumers' line
# (head) and a take the producers' (tail), but under one lock only the writes make lines bounce:
# producers alone never touch the consumers' line, consumers alone never the producers'.
# ``bells``: how many of the sleepers counted in cwait are a server's doorbells (``doze.bell``),
# which a put made by that server's own loop owes no post (``waits.serving``); on the put's line.
# ``room``: positions from the tail up to it lie in allocated chunks (``memory.py``), so a put that ends
# at or below it writes no hole: one compare on the put's own line (at or below the tail: look again).
HOT_LINES = (
    ("deleted", "tail", "next_id", "pwait", "pposted", "settings_gen", "bells", "room"),
    ("head", "frontier", "ready_pos", "requeued", "in_flight", "delayed", "next_deadline", "next_liveness"),
    ("ready", "cwait", "cposted"),  # then the counters, written rarely (the totals are per process)
)
HOT_FIELDS = tuple(f if f else f"_pad{i}" for i, f in enumerate(f for line in HOT_LINES for f in line))
HOT = struct.Struct("<%dQ" % len(HOT_FIELDS))
COUNTERS_OFF = HOT_OFF + HOT.size
COUNTER_FIELDS = ("acked_total", "redelivered_total", "dead_lettered_total", "purged_total", "repairs")
COUNTERS = struct.Struct("<%dQ" % len(COUNTER_FIELDS))
# write-ahead log words: bytes appended to the current generation, bytes known fsynced
WAL_WORDS_OFF = 768
# the creator's CLOCK_MONOTONIC offset (its time namespace's; 0 in the initial one):
# deadlines are monotonic values shared by every process, so all must read one clock
TIMENS_OFF = 784
# in lane 0 of a laned queue: its gets asleep (counted in cwait too). Puts into the other lanes read
# it, so it shares a line only with words written rarely (the log's sizes, for a "wal" queue)
LANE_SLEEPERS_OFF = 792
# --- memory taken chunk by chunk (``memory.py``) --------------------------------------------------
# A queue's or partition's segment is sparse: its header is allocated at create, its ring (and a
# partition's index) a CHUNK at a time, before anything is written there, and given back where
# nothing lives. The memory block: its words (below), then a bitmap of the segment file's chunks,
# bit k set when bytes [k * CHUNK, (k + 1) * CHUNK) are allocated (set after the allocation, cleared
# before the hole is punched, both under the object's lock). Words: ``mark``, the tail at the last
# give-back round (what was written since says how much room ahead to keep); ``fence`` / ``fence_low``,
# a partition's head and earliest offset seen at least GIVE_BACK_GRACE_NS ago (no lock-free reader
# can still be below them), ``cand`` / ``cand_low`` / ``cand_ns``, the next fence and when it was
# seen; ``grown_total`` / ``given_total`` bytes allocated and given back, ``refused_total`` grows
# /dev/shm refused, ``rounds`` give-back rounds; ``quiet_a`` / ``quiet_b``, the state (+1: 0 is none) in
# which a round last left nothing to give back, so a round that finds it unchanged does nothing;
# ``claim_lo`` / ``claim_hi`` / ``claim_owner``, chunks a producer allocates ahead outside the lock (its
# process slot + 1; 0: none), which no round gives back meanwhile; ``grow_due``, 1 once a put found its
# room short (the next to see it claims the chunks ahead)
CHUNK_SHIFT = 16
CHUNK = 1 << CHUNK_SHIFT  # 64 KiB
MEM_FIELDS = ("mark", "fence", "fence_low", "cand", "cand_low", "cand_ns", "grown_total", "given_total",
              "refused_total", "rounds", "quiet_a", "quiet_b", "claim_lo", "claim_hi", "claim_owner", "grow_due")
MEM_SIZE = 128  # the words, then the bitmap
BITMAP_BYTES = 8320  # 66560 chunks: a ring of MAX_RING_BYTES and any header or index beside it
MAX_RING_BYTES = 2**32 - CHUNK  # a ring's most bytes (a record's length, a pad's, is a u32)
GIVE_BACK_GRACE_NS = 1_000_000_000  # a partition's region behind its head is given back this long after
GIVE_BACK_BUDGET = 16 * 2**20  # bytes given back per round at most (a punch holds the lock ~0.2 ms a MiB)
ROOM_LOOK = 8 << 20  # how far past a write a queue's room (allocated memory ahead of its tail) is looked for
MEM_OFF = 1088  # a queue's memory block, after the level cursors (a cache line apart)
WORD = struct.Struct("<q")  # one signed word
PROCS_OFF = MEM_OFF + MEM_SIZE + BITMAP_BYTES  # 9536
# process slot, one cache line each: pid, start_ms, consumers waiting, producers waiting, and the
# process's share of the totals every take and ack bumps (acked, redelivered: summed by ``stats``,
# folded into the queue's own counters when the process is reaped), so the hot paths write a line
# of their own process, never one that bounces between cores; then its doorbells asleep (of cwait);
# then how many consumers it registered (``lifetime.py``: reaped with it when it dies)
PROC = struct.Struct("<QQQQQQQQ")
PROC_SIZE = PROC.size
# the work-queue options (``create_queue``; fixed at creation): priority levels, priority aging (ms;
# 0: strict), message_ttl (0: none), dedup_window, retry_delay, retry_backoff (a float),
# retry_delay_max (0: none); times in ns unless said; then the queue's lanes (``lanes.py``: 0 or 1,
# one ring) and which of them this segment is: lane j's message ids are j + 1, j + 1 + lanes, ...
OPTS = struct.Struct("<IIQQQdQII")
OPTS_FIELDS = ("levels", "priority_aging_ms", "message_ttl_ns", "dedup_window_ns", "retry_delay_ns", "retry_backoff",
               "retry_delay_max_ns", "lanes", "lane")
OPTS_OFF = 800
MAX_PRIORITIES = 16
OPTS_LANES_OFF = OPTS_OFF + field_offsets(OPTS, OPTS_FIELDS)["lanes"]  # (u32) the C paths' id step
# extra control words: special (records that need the general take may exist: extensions or a
# delayed put), next_ttl (wall ns: no ready message expires before it), expired_total; and in
# lane 0 of a laned queue, the turns its handles took (``lanes.py``: their own and home lanes); then
# voided, the message ids fills took that never became messages (a reservation that raised, a holder
# that died: ``enqueued_total`` leaves them out)
XWORDS_OFF = OPTS_OFF + OPTS.size
XWORD_FIELDS = ("special", "next_ttl", "expired_total", "producer_turns", "consumer_turns", "voided")
# then one word per priority level: a lower bound of the position of its first ready record
LEVEL_POS_OFF = XWORDS_OFF + 8 * len(XWORD_FIELDS)
# the dedup table (``put(dedup_id=...)``), after the process table: DEDUP_SLOTS entries of
# (hash of the id, message id, wall ns it is remembered until), open addressing, probed
# at most DEDUP_PROBES slots; hash 0 is a free slot
DEDUP = struct.Struct("<QQQ")
DEDUP_SLOTS = 4096
DEDUP_PROBES = 64

# --- control words, as indices into the segment viewed as 64-bit words -------------------
_HOT_W = {f: (HOT_OFF >> 3) + i for i, f in enumerate(HOT_FIELDS)}
I_DELETED, I_HEAD, I_TAIL, I_FRONTIER, I_READY_POS, I_REQUEUED, I_NEXT_ID, I_READY = (
    _HOT_W[f] for f in ("deleted", "head", "tail", "frontier", "ready_pos", "requeued", "next_id", "ready"))
I_INFLIGHT, I_DELAYED, I_NEXT_DEADLINE, I_NEXT_LIVENESS, I_CWAIT, I_CPOSTED, I_PWAIT, I_PPOSTED = (
    _HOT_W[f] for f in ("in_flight", "delayed", "next_deadline", "next_liveness", "cwait", "cposted", "pwait",
                        "pposted"))
I_BELLS, I_ROOM = _HOT_W["bells"], _HOT_W["room"]
I_ACKED_TOTAL, I_REDELIVERED_TOTAL, I_DEAD_TOTAL, I_PURGED_TOTAL, I_REPAIRS = range(
    COUNTERS_OFF >> 3, (COUNTERS_OFF >> 3) + len(COUNTER_FIELDS))
I_WAL_SIZE, I_WAL_SYNCED = WAL_WORDS_OFF >> 3, (WAL_WORDS_OFF >> 3) + 1
I_WAL_GEN, I_WAL_MODE = WALCFG_OFF >> 3, (WALCFG_OFF >> 3) + 1  # WALCFG's generation; fsync mode (low half)
I_LANE_SLEEPERS = LANE_SLEEPERS_OFF >> 3
I_SPECIAL, I_NEXT_TTL, I_EXPIRED_TOTAL, I_PRODUCER_TURNS, I_CONSUMER_TURNS, I_VOIDED = range(
    XWORDS_OFF >> 3, (XWORDS_OFF >> 3) + len(XWORD_FIELDS))
I_LEVEL_POS = LEVEL_POS_OFF >> 3  # + level
I_LIFETIME, I_LAST_USED = LIFETIME_OFF >> 3, (LIFETIME_OFF >> 3) + 1
I_FILL, I_WRAP = FILL_OFF >> 3, WRAP_OFF >> 3


def mem_words(mem_off: int) -> dict:
    """Word index of each MEM_FIELDS word of a memory block at ``mem_off``, and of its bitmap ("bitmap")."""
    out = {f: (mem_off >> 3) + i for i, f in enumerate(MEM_FIELDS)}
    out["bitmap"] = (mem_off + MEM_SIZE) >> 3
    return out
# process slot words: pid, start_ms, consumers waiting, producers waiting, acked, redelivered, bells, consumers
P_CWAIT, P_PWAIT, P_ACKED, P_REDELIVERED, P_BELLS, P_CONSUMERS = 2, 3, 4, 5, 6, 7
# write-ahead log fsync modes (WALCFG); SUSPENDED, with generation 0: the data dir vanished
WAL_NEVER, WAL_ALWAYS, WAL_BATCH, WAL_SUSPENDED = 0, 1, 2, 3
# a flag on the mode (its low half: the policy, ``& WAL_POLICY``): the server's disk alarm (its data dir below
# --disk-free-limit): the log takes what settles (acks, purges) but no put or append, and C appends nothing
WAL_ALARM, WAL_POLICY = 0x10, 0xF

assert HOT_OFF >= MUTEX_OFF + 64 and HOT_OFF % 64 == 0  # (the lines of HOT_LINES are cache lines)
assert MUTEX_OFF + 48 <= WRAP_OFF < FILL_OFF < MUTEX_OFF + 64
assert STATIC.size <= WALCFG_OFF and WALCFG_OFF + WALCFG.size <= LIFETIME_OFF and LIFETIME_OFF + 16 <= MUTEX_OFF
assert COUNTERS_OFF + COUNTERS.size <= WAL_WORDS_OFF and WAL_WORDS_OFF + 16 <= TIMENS_OFF < PROCS_OFF
assert TIMENS_OFF + 8 <= LANE_SLEEPERS_OFF and LANE_SLEEPERS_OFF + 8 <= OPTS_OFF
assert LEVEL_POS_OFF + 8 * MAX_PRIORITIES <= MEM_OFF and PROCS_OFF % 64 == 0 and MEM_SIZE >= 8 * len(MEM_FIELDS)

# --- record extension ----------------------------------------------------------------------
# A record whose ``flags`` has FLAG_EXT starts its header bytes with an extension block (then the
# msgpack headers, if any). Its first byte, 0xC1, is one msgpack never uses, so header bytes say
# by themselves whether they carry one (snapshots and logs keep them as they are). Fields:
# magic, version, priority, pad, group length, pad, due (wall ns a delayed put becomes ready; 0:
# none), expires (wall ns; 0: never), dedup hash (0: none); then the group's UTF-8 bytes.
EXT = struct.Struct("<BBBBHHqqQ")
EXT_MAGIC = 0xC1
EXT_VERSION = 1
FLAG_EXT = 0x100  # flags: low byte = priority level; this bit = an extension block
FLAG_WALK = 0x200  # ... with a due time or a group: only the general take's walk takes it
FLAG_TTL = 0x400  # ... with an expiry: a take checks it before it leases the record
MAX_GROUP_BYTES = 255


def proc_word(slot: int, field: int) -> int:
    """Word index of ``field`` (P_*) of process slot ``slot``."""
    return ((PROCS_OFF + slot * PROC_SIZE) >> 3) + field


def id_step(lanes: int) -> int:
    """How far apart a lane's consecutive message ids are (``OPTS``' lanes: 0 or 1 is one ring)."""
    return lanes or 1


def align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) & ~(to - 1)


_REC_ROUNDED = REC_SIZE + ALIGN - 1  # (record_size's one addition: the header, and the rounding up)


def record_size(hdr_len: int, body_len: int) -> int:
    """Bytes a record takes in the ring, its header, headers (or key and headers) and body
    rounded up to ALIGN: the one place it is computed in Python, with ``sized`` below, its
    form for a batch (_fast.c's twin: ``rec_size``)."""
    return (_REC_ROUNDED + hdr_len + body_len) & -ALIGN


def sized(bodies, hraw: bytes) -> list[tuple]:
    """Each body of a batch with ``hraw`` (its headers' or extension's bytes) and its record's
    size, ``record_size``'s: ``(body, hraw, size)`` items in one call a batch, not one a record
    (a pure-Python put_many's)."""
    first = _REC_ROUNDED + len(hraw)  # (record_size's addition, the header's part once)
    return [(body, hraw, (first + len(body)) & -ALIGN) for body in bodies]


def dedup_offset(proc_slots: int) -> int:
    return align(PROCS_OFF + proc_slots * PROC_SIZE, 64)


def data_offset(proc_slots: int) -> int:
    return align(dedup_offset(proc_slots) + DEDUP_SLOTS * DEDUP.size, 4096)


def segment_size(capacity: int, proc_slots: int) -> int:
    return data_offset(proc_slots) + capacity


REUSE_MAX = 2**20


def reuse_after(capacity: int) -> int:
    """How far into its lap a queue's tail may be for a put into the empty queue to start
    the next lap instead (``produce._room``): the memory just freed at the ring's start is
    written again, still allocated and in the CPU's caches, rather than new memory ahead."""
    return min(REUSE_MAX, capacity // 4)


# positions past this are brought back to 0 when the queue is next empty (a jump to the next lap
# uses a lap of positions): a delivery of before is then past the tail, and expired
POS_LIMIT = 2**62


def status_word(state: int, holder: int = NO_HOLDER, attempt: int = 0) -> int:
    return state | (holder << 8) | (attempt << 32)


def split_status(word: int) -> tuple[int, int, int]:
    """(state, holder, attempt) of a status word."""
    return word & 0xFF, (word >> 8) & 0xFFFF, word >> 32


def skip_gap(pos: int, capacity: int) -> int:
    """The position itself, or the start of the next lap when too little of this one
    remains to hold even a record header (an implicit pad)."""
    rem = capacity - pos % capacity
    return pos + rem if rem < REC_SIZE else pos


def place(tail: int, size: int, capacity: int) -> tuple[int, int]:
    """Where a record of ``size`` bytes appended at ``tail`` starts, and the new tail.

    The record starts at ``tail`` when it fits before the end of the lap, else at the
    start of the next lap (the skipped bytes are a pad). The caller checks room:
    ``new_tail - head <= capacity``.
    """
    rem = capacity - tail % capacity
    start = tail if size <= rem else tail + rem
    return start, start + size


# --- what the C hot paths return other than success -------------------------------------
# (name, value, meaning): _layout.h's ``enum shmq_ret``, and the plain ints below, which cpaths.py
# hands the engine (None there where C does not run); _fast exports the first eight without R_
RETURNS = (
    ("R_BUSY", -1, "lock busy: not taken"),
    ("R_OWNERDEAD", -2, "lock taken from a dead holder: the caller repairs, then unlocks"),
    ("R_FALLBACK", -3, "not a fast-path case: lock released, nothing changed"),
    ("R_EXPIRED", -4, "ack: the delivery is no longer leased"),
    ("R_DELETED", -5, "the queue was deleted"),
    ("R_EMPTY", -6, "take: nothing ready, nothing due (lock released)"),
    ("R_SLEEP", -7, "take: the same, and the caller counted as a sleeper (W_REGISTER); put: see R_FULL"),
    ("R_FULL", -8, "put: no room now (lock released); R_SLEEP: and the caller counted as waiting for it"),
    ("R_OSERROR", -9, "internal: a log write failed (errno set); raised as OSError"),
    ("R_UNFINISHED", -10, "internal: a fill copied, its lock busy or taken from a dead holder: Python ends it"),
)
_RET = {name: value for name, value, _meaning in RETURNS}
R_BUSY, R_OWNERDEAD, R_FALLBACK, R_EXPIRED, R_DELETED, R_EMPTY, R_SLEEP, R_FULL, R_OSERROR, R_UNFINISHED = (
    _RET[n] for n in ("R_BUSY", "R_OWNERDEAD", "R_FALLBACK", "R_EXPIRED", "R_DELETED", "R_EMPTY", "R_SLEEP", "R_FULL",
                      "R_OSERROR", "R_UNFINISHED"))


# --- the C hot paths' copy ---------------------------------------------------------------


def c_header() -> str:
    """The text of ``_layout.h``: every constant ``_fast.c`` uses, from this module
    (``python -m shmq.mirrors`` writes it, under its banner; a test fails while it is stale)."""
    defines = {
        "MUTEX_OFF": MUTEX_OFF, "HOT_W": HOT_OFF >> 3, "COUNTERS_W": COUNTERS_OFF >> 3,
        "WALCFG_W": I_WAL_GEN, "WAL_WORDS_W": I_WAL_SIZE, "REC_SIZE": REC_SIZE,
        "ST_READY": READY, "ST_LEASED": LEASED, "ST_ACKED": ACKED, "ST_PAD": PAD, "ST_FILLING": FILLING,
        "FILL_OFF": FILL_OFF, "FILL_MIN": FILL_MIN, "WRAP_OFF": WRAP_OFF, "LARGE": LARGE, "WINDOW_MIN": WINDOW_MIN,
        "WINDOW_RECORDS": WINDOW_RECORDS, "FILL_STALE_NS": f"{FILL_STALE_NS}ULL", "WAL_ALWAYS": WAL_ALWAYS, "WAL_ALARM": WAL_ALARM,
        "SPECIAL_W": I_SPECIAL, "NEXT_TTL_W": I_NEXT_TTL, "LEVEL_POS_W": I_LEVEL_POS,
        "MAX_PRIORITIES": MAX_PRIORITIES, "FLAG_TTL": FLAG_TTL, "NO_HOLDER": NO_HOLDER,
        "PROCS_OFF": PROCS_OFF, "PROC_SIZE": PROC_SIZE, "P_CWAIT": P_CWAIT, "P_PWAIT": P_PWAIT, "P_ACKED": P_ACKED,
        "P_REDELIVERED": P_REDELIVERED, "OPTS_LANES_OFF": OPTS_LANES_OFF,
        "REUSE_MAX": REUSE_MAX, "FLAG_NULL_VALUE": FLAG_NULL_VALUE, "FLAG_CONTROL": FLAG_CONTROL,
        "FLAG_ABORTED": FLAG_ABORTED,
        "LIFETIME_W": I_LIFETIME, "LAST_USED_W": I_LAST_USED, "LIFE_EXPIRES_SHIFT": LIFE_EXPIRES_SHIFT,
        "LIFE_RENEW_NS": f"{LIFE_RENEW_NS}ULL",
        "POS_LIMIT": f"{POS_LIMIT}ULL", "CHUNK_SHIFT": CHUNK_SHIFT, "ROOM_LOOK": ROOM_LOOK,
        "QMEM_BITMAP_W": (MEM_OFF + MEM_SIZE) >> 3,
    }
    defines.update({"REC_" + f.upper(): off for f, off in REC_OFFSETS.items()})
    from ...formats import dmsq  # the log entry's format (docs/FORMAT.md)

    log_fields = ("tag", "hdr_len", "body_len", "attempt", "msg_id", "enq_ns")
    defines.update({"LOG_" + f.upper(): off for f, off in field_offsets(dmsq.LOG_HEAD, log_fields).items()})
    defines.update({"LOG_HEAD": dmsq.LOG_HEAD.size, "LOG_PUT": dmsq.PUT, "LOG_ACK": dmsq.ACK,
                    "LOG_PUBLISH": dmsq.PUBLISH, "PUBLISH_BODY": dmsq.PUBLISH_BODY.size,
                    "LOG_NULL_VALUE": f"{dmsq.NULL_VALUE}U",
                    "LOG_TAG_BYTES": '"%s"' % dmsq.LOG_TAG.decode("ascii")})
    lines = ["#ifndef SHMQ_LAYOUT_H", "#define SHMQ_LAYOUT_H", ""]
    lines += [f"#define {k} {v}" for k, v in defines.items()]
    lines.append("/* control words, from HOT_W; counters, from COUNTERS_W */")
    lines.append("enum { " + ", ".join(f"H_{f.upper()} = {i}" for i, f in enumerate(HOT_FIELDS)
                                      if not f.startswith("_")) + " };")
    lines.append("enum { " + ", ".join(f"C_{f.upper()} = {i}" for i, f in enumerate(COUNTER_FIELDS)) + " };")
    lines.append("/* results other than success */")
    lines += ["enum shmq_ret {", *(f"    {name} = {value}, /* {meaning} */" for name, value, meaning in RETURNS), "};"]
    lines += ["", "#endif", ""]
    return "\n".join(lines)


# --- streams -------------------------------------------------------------------------------
# A stream is a meta segment (settings, the consumer groups, readers waiting) and one
# segment per partition (a ring of records whose msg_id is the record's offset; the
# deadline word holds the key's length + 1, 0 for no key; the key precedes the encoded
# headers in the record's header bytes; flags has FLAG_NULL_VALUE when the value is null,
# a tombstone, whose body is then empty). Offsets are found through a sparse index: the
# position of every INDEX_STRIDE-th offset.
FLAG_NULL_VALUE = 0x1  # a stream record's flags (0 before tombstones: such records read as they did)
# a transaction's marker (Kafka's control record: the transaction coordinator writes it), and a
# record of a transaction that aborted (set in place): a reader of records skips both
FLAG_CONTROL = 0x2
FLAG_ABORTED = 0x4
STREAM_MAGIC = b"SHMS"
PART_MAGIC = b"SHMP"
STREAM_VERSION = 7  # 4: the groups' owner-since words; 5: the members' poll deadlines; 6: a partition's memory
# taken chunk by chunk (its memory block before the index); 7: the partition count and the settings in STREAM_LIVE
# change on a live stream (timestamp type, compression and segment bytes added)
MAX_GROUPS = 64
MAX_MEMBERS = 64
NO_OFFSET = 2**64 - 1  # a group's committed offset before its first commit; no log on disk
RETENTION = {"drop": 0, "block": 1}
RETENTION_NAMES = {v: k for k, v in RETENTION.items()}
# what a record's timestamp is (Kafka's message.timestamp.type): its producer's (a Kafka producer's CreateTime), or the
# time of the append (LogAppendTime: the Kafka listener stamps it); the batches the Kafka listener stores and serves
# (compression.type): as their producer sent them, or in this codec
TIMESTAMP_TYPE = {"create_time": 0, "log_append_time": 1}
TIMESTAMP_TYPE_NAMES = {v: k for k, v in TIMESTAMP_TYPE.items()}
COMPRESSION = {"producer": 0, "uncompressed": 1, "gzip": 2, "snappy": 3, "lz4": 4, "zstd": 5}
COMPRESSION_NAMES = {v: k for k, v in COMPRESSION.items()}
INDEX_STRIDE = 16
# partition: magic, version, pad, capacity, max_message_bytes, index slots, data offset, created_ns
PART_STATIC = struct.Struct("<4sHHQQQQQ")
PART_MUTEX_OFF = 64
PART_CTL_OFF = 128
# disk_first: 1 + the first offset of the oldest log file still on disk (0: none, as a new
# segment's zeroed word says), the long tail readers reach below ``earliest``; wal_mark / wal_mark_offset: unused
# (a repair finds an uncommitted append's entries by their offsets, ``Log.repair``); hwm: no offset at or above it was handed out since the high-water file
# last said so (snapshot streams), hwm_epoch: snapshots taken (each resets hwm to the end),
# hwm_base: the end at the last of them, hwm_span: offsets handed out in the epoch before,
# hwm_writes: writes of the high-water file;
# wal_rolled_ns: when the current log generation began (wall clock)
PART_FIELDS = ("deleted", "head", "tail", "earliest", "next_offset", "pwait", "pposted", "appended_total",
               "dropped_total", "bytes_dropped", "disk_first", "wal_mark", "wal_mark_offset", "hwm", "hwm_epoch",
               "hwm_base", "hwm_span", "hwm_writes", "wal_rolled_ns")
(PI_DELETED, PI_HEAD, PI_TAIL, PI_EARLIEST, PI_NEXT, PI_PWAIT, PI_PPOSTED, PI_APPENDED, PI_DROPPED,
 PI_BYTES_DROPPED, PI_DISK_FIRST, PI_WAL_MARK, PI_WAL_MARK_OFFSET, PI_HWM, PI_HWM_EPOCH, PI_HWM_BASE,
 PI_HWM_SPAN, PI_HWM_WRITES, PI_WAL_ROLLED) = range(PART_CTL_OFF >> 3, (PART_CTL_OFF >> 3) + len(PART_FIELDS))
# a partition's log words and log config: the same two structures as a queue's
# (WAL_WORDS_OFF, WALCFG), at offsets of the partition segment (``wal.Log`` takes both)
PART_WAL_WORDS_OFF = 280
PART_WALCFG_OFF = 304
# a partition's publishers' table (``Partition.append(txn=...)``, the Spark sink's exactly-once
# publish): per publisher id, the newest batch published here and the end offset it
# committed, and the same of the batch before (restored by a repair when the newer one's
# records never committed), and when it was written (the oldest entry makes room)
TXN = struct.Struct("<16sQQQQQ")  # id, batch, end, previous batch, previous end, written_ns
MAX_TXNS = 32
# 0 while no transaction is open in the partition, else 1 + the first offset of the oldest
# open one (the last stable offset: a reader of records reads nothing at or past it); the
# transaction coordinator writes it (zero in an older segment: none open)
PART_STABLE_OFF = 472
PI_STABLE = PART_STABLE_OFF >> 3
# a compacted stream's partition (``compaction.compact``; zero in an older segment: never compacted):
# cleaned, 1 + the offset compaction has run up to (below it an offset with no record was compacted
# away, not lost: a read there goes on at the next record); compact_low, 1 + the partition's start
# (Kafka's log start offset) where it is below earliest: the earliest offset before the compactions
# since retention last dropped records, or where a trim (DeleteRecords) put it (a read in
# [compact_low - 1, earliest) goes on at earliest; a drop by retention sets it to 0); compactions,
# the runs that took records back; bytes_compacted, the ring bytes they took back
PART_CLEAN_OFF = 480
PART_CLEAN_FIELDS = ("cleaned", "compact_low", "compactions", "bytes_compacted")
(PI_CLEANED, PI_COMPACT_LOW, PI_COMPACTIONS, PI_BYTES_COMPACTED) = range(
    PART_CLEAN_OFF >> 3, (PART_CLEAN_OFF >> 3) + len(PART_CLEAN_FIELDS))
PART_TXN_OFF = 512
PART_MEM_OFF = PART_TXN_OFF + MAX_TXNS * TXN.size  # the partition's memory block (``memory.py``)
PART_INDEX_OFF = PART_MEM_OFF + MEM_SIZE + BITMAP_BYTES  # 10752
# stream meta: magic, version, partitions, retention, durability, timestamp type, compression, max_bytes,
# max_message_bytes, retention_bytes (0: none), retention_ns (0: none), group_idle_ns, created_ns; then
# segment_bytes (Kafka's segment.bytes, shown and kept, no effect; 0: none)
STREAM_STATIC = struct.Struct("<4sHHBBBB4xQQQQQQ")
STREAM_STATIC_FIELDS = ("magic", "version", "partitions", "retention", "durability", "timestamp_type", "compression",
                        "_pad", "max_bytes", "max_message_bytes", "retention_bytes", "retention_ns", "group_idle_ns",
                        "created_ns")
_STREAM_OFFSETS = field_offsets(STREAM_STATIC, STREAM_STATIC_FIELDS)
STREAM_CREATED_OFF = _STREAM_OFFSETS["created_ns"]  # a rebuilt stream keeps its own
STREAM_SEGMENT_BYTES_OFF = STREAM_STATIC.size
# compaction (Kafka's cleanup.policy=compact): compact (1: the latest record of each key is kept), then
# 1 + delete_retention_ns (how long a tombstone stays), 1 + the min cleanable dirty ratio in millionths
# (0 in either: the default), max_compaction_lag_ns (0: none)
STREAM_COMPACT_OFF = STREAM_SEGMENT_BYTES_OFF + 8
# What a live stream's handles read afresh (``Stream._live``; ``Broker.update_stream``, ``Stream.add_partitions``
# change them): field -> (word, shift, mask).
# Each is read by one aligned load of the word that holds it, and written under the stream's lock by one store of
# that word (the partition count last, once the partitions it counts exist: the commit of a growth).
STREAM_LIVE = {f: (off >> 3, (off & 7) * 8, (1 << 8 * size) - 1) for f, off, size in (
    *((f, _STREAM_OFFSETS[f], struct.calcsize(c)) for f, c in (
        ("partitions", "H"), ("timestamp_type", "B"), ("compression", "B"), ("max_message_bytes", "Q"),
        ("retention_bytes", "Q"), ("retention_ns", "Q"))),
    ("segment_bytes", STREAM_SEGMENT_BYTES_OFF, 8), ("compact", STREAM_COMPACT_OFF, 1),
    ("delete_retention_ns", STREAM_COMPACT_OFF + 8, 8), ("dirty_ratio_ppm", STREAM_COMPACT_OFF + 16, 8),
    ("max_compaction_lag_ns", STREAM_COMPACT_OFF + 24, 8))}
STREAM_MUTEX_OFF = 128
STREAM_CTL_OFF = 192
STREAM_FIELDS = ("deleted", "cwait", "cposted", "next_member", "bells")  # bells: of cwait, a server's doorbells
(SI_DELETED, SI_CWAIT, SI_CPOSTED, SI_NEXT_MEMBER, SI_BELLS) = range(STREAM_CTL_OFF >> 3, (STREAM_CTL_OFF >> 3) + len(STREAM_FIELDS))
# a group: used, name, generation, last time a member was seen (monotonic ns), members
# (pid, start_ms, member id), committed offset per partition, then per partition the
# generation since which its current owner has owned it (``groups``: who may resume its
# own position), then per member slot its poll deadline (monotonic ns by which it polls
# again, else it is taken for gone: max_poll_interval; 0: none)
GROUP_HEAD = struct.Struct("<QH126sQQ")
MEMBER = struct.Struct("<QQQ")
GROUPS_OFF = 256
GROUP_COMMITTED_OFF = GROUP_HEAD.size + MAX_MEMBERS * MEMBER.size  # from the group's start
GROUP_SINCE_OFF = GROUP_COMMITTED_OFF + MAX_PARTITIONS * 8
GROUP_DEADLINE_OFF = GROUP_SINCE_OFF + MAX_PARTITIONS * 8
GROUP_SIZE = align(GROUP_DEADLINE_OFF + MAX_MEMBERS * 8, 64)
STREAM_SIZE = GROUPS_OFF + MAX_GROUPS * GROUP_SIZE

assert PART_STATIC.size <= PART_MUTEX_OFF and PART_CTL_OFF + 8 * len(PART_FIELDS) <= PART_WAL_WORDS_OFF
assert PART_WAL_WORDS_OFF + 16 <= PART_WALCFG_OFF and PART_WALCFG_OFF + WALCFG.size <= PART_STABLE_OFF
assert PART_STABLE_OFF + 8 <= PART_CLEAN_OFF and PART_CLEAN_OFF + 8 * len(PART_CLEAN_FIELDS) <= PART_TXN_OFF
assert PART_INDEX_OFF % 64 == 0
assert STREAM_COMPACT_OFF + 32 <= STREAM_MUTEX_OFF and STREAM_CTL_OFF + 8 * len(STREAM_FIELDS) <= GROUPS_OFF
assert GROUP_COMMITTED_OFF % 8 == 0 and GROUP_SIZE % 8 == 0


def index_slots(capacity: int) -> int:
    """Index entries a partition of ``capacity`` bytes needs: one per INDEX_STRIDE of the
    most records it can hold (every record takes at least a header)."""
    return capacity // (REC_SIZE * INDEX_STRIDE) + 2


def part_data_offset(capacity: int) -> int:
    return align(PART_INDEX_OFF + index_slots(capacity) * 8, 4096)


# --- the JVM stream reader's copy ------------------------------------------------------------


def java_layout() -> str:
    """The text of ``Layout.java``: every offset and flag the JVM connector's stream reader
    (shmq/spark/jvm) uses, from this module (Java has no preprocessor to share ``_layout.h``).
    (``python -m shmq.mirrors`` writes it, under its banner; a test fails while it is stale)."""
    part = field_offsets(PART_STATIC, ("magic", "version", "_pad", "capacity", "max_message_bytes", "index_slots",
                                       "data_offset", "created_ns"))
    stream, rec = _STREAM_OFFSETS, REC_OFFSETS

    def magic(name: str, b: bytes) -> tuple:  # the int a little-endian read of the 4 bytes gives
        return name, hex(int.from_bytes(b, "little")), f'b"{b.decode("ascii")}" read little-endian'

    # a str: a Javadoc line on the constants after it; None: a blank line; else (name, value[, comment])
    body = (
        "The stream's meta segment: magic, version, partitions (u16 at %d; it grows on a live stream: read at open)."
        % stream["partitions"],
        magic("STREAM_MAGIC", STREAM_MAGIC), ("STREAM_VERSION", STREAM_VERSION),
        ("STREAM_PARTITIONS_OFF", stream["partitions"]),
        "Its durability (u8 at %d): DURABILITY_WAL keeps records in logs on disk past what shared memory holds."
        % stream["durability"],
        ("STREAM_DURABILITY_OFF", stream["durability"]), ("DURABILITY_WAL", DURABILITY["wal"]),
        ("STREAM_STATIC_SIZE", STREAM_STATIC.size),
        None,
        "A partition segment's static header: magic, version, pad, capacity, max message, index slots, data offset.",
        magic("PART_MAGIC", PART_MAGIC), ("PART_VERSION_OFF", part["version"]),
        ("PART_CAPACITY_OFF", part["capacity"]), ("PART_SLOTS_OFF", part["index_slots"]),
        ("PART_DATA_OFF", part["data_offset"]), ("PART_STATIC_SIZE", PART_STATIC.size),
        None,
        "The partition's control words.",
        ("PART_DELETED", PI_DELETED * 8), ("PART_HEAD", PI_HEAD * 8), ("PART_TAIL", PI_TAIL * 8),
        ("PART_EARLIEST", PI_EARLIEST * 8), ("PART_NEXT", PI_NEXT * 8), ("PART_DISK_FIRST", PI_DISK_FIRST * 8),
        "0 while no transaction is open in the partition, else 1 + the last stable offset: readers read below it.",
        ("PART_STABLE", PART_STABLE_OFF),
        "A compacted partition: 1 + the offset compaction has run up to (a gap below it is compaction's, not a loss).",
        ("PART_CLEANED", PI_CLEANED * 8),
        "1 + the earliest offset before the compactions since retention last dropped: below earliest from it, "
        "read on at earliest.",
        ("PART_COMPACT_LOW", PI_COMPACT_LOW * 8),
        "The sparse offset index: the position of every INDEX_STRIDE-th offset, slot = offset / stride % slots.",
        ("PART_INDEX_OFF", PART_INDEX_OFF), ("INDEX_STRIDE", INDEX_STRIDE),
        None,
        f"A record's {REC_SIZE}-byte header.",
        ("REC_SIZE", REC_SIZE),
        *(("REC_" + f.upper(), rec[f])
          for f in ("status", "length", "body_len", "hdr_len", "flags", "msg_id", "enq_ns")),
        "In a stream record: the key's length + 1, 0 for no key; the key precedes the headers.",
        ("REC_KEY", rec["deadline"]),
        "In a stream record's flags: its value is null (a tombstone, its value bytes none).",
        ("FLAG_NULL_VALUE", hex(FLAG_NULL_VALUE)),
        "In a stream record's flags: a transaction's marker, and a record of a transaction that aborted "
        "(readers pass over both).",
        ("FLAG_CONTROL", hex(FLAG_CONTROL)), ("FLAG_ABORTED", hex(FLAG_ABORTED)),
        "Status (low byte) of a filler record to the end of the lap.",
        ("PAD", PAD),
    )
    lines = ["package io.shmq.spark.shm;", "",
             "/**",
             " * The byte layout of a stream's segments, as shmq/engine/shm/layout.py defines it (the one source:",
             " * python -m shmq.mirrors writes this file, tests/test_mirrors.py fails while it is stale).",
             " * Offsets are in bytes.", " */",
             "public final class Layout {", "    private Layout() {", "    }", ""]
    for item in body:
        if item is None:
            lines.append("")
        elif isinstance(item, str):
            lines.append(f"    /** {item} */")
        else:
            name, value, *comment = item
            lines.append(f"    public static final int {name} = {value};" + "".join(f" // {c}" for c in comment))
    lines += ["}", ""]
    return "\n".join(lines)


