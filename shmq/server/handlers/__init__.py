"""One function per request type, in one table: ``HANDLERS[msg_type](conn, fields)``
returns the reply payload, raises, or (a CONSUME, READ or POLL with nothing there yet)
returns a ``Wait`` (an append that may wait for room: a ``BlockingAppend``).

Strategy: a handler knows nothing of sockets, frames or msg ids. It gets the connection
it serves and the request's checked fields (``validate_request``), calls only the
engine's public API, and returns the payload; the connection turns the payload, an
exception (``status_of``) or a ``Wait`` into frames. Every engine call here is
non-blocking (``put_nowait``, ``get_many(timeout=0)``, settles, ``read(timeout=0)``,
``poll(timeout=0)``), so it holds a lock for microseconds and the loop never waits.
What a handler uses of ``conn``:

- ``conn.server``: ``broker``, ``queue(name)`` / ``stream(name)`` (cached handles;
  ``queues``: the queues' ``AttachedHandles``, read by the plain requests' handlers),
  ``forget(name)``, ``notify(name)``, ``waiters_of(q)``, ``streams`` (``forget``,
  ``notify``, ``line_of``), ``stores`` (``get``, ``line_of``, ``wrote``: server/stores.py),
  ``on_create``, ``token``, ``max_frame_bytes``, ``stopping``;
- ``conn.leases``: the deliveries the connection holds (``leases.Leases``);
- ``conn.members``: the group members it holds (``members.Members``);
- ``conn.authenticated()``: after a HELLO with the right token.

The handlers live by area, one module each: ``session`` (HELLO, PING, BACKUP), ``queues``,
``streams``, ``groups`` (a stream's consumer groups), ``exchanges`` (and REQUEST), ``kv``
(the keyed stores), ``txns`` (a transaction's requests, on the server's coordinator);
``answers`` holds what a handler returns when it does not answer at once, and the helpers
the waiting handlers share.
"""

from ...protocol import MsgType
from ...protocol.requests import PLAIN_CHECKS
from . import exchanges, groups, kv, queues, session, streams, txns
from .answers import RECORD_OVERHEAD, BlockingAppend, OffLoop, OnLoop, Wait
from .queues import consumed_frame, give_back_consumers, plain_args, plain_take, waiting_consume
from .streams import fill

__all__ = ["HANDLERS", "PLAIN", "Wait", "waiting_consume", "plain_take", "plain_args", "BlockingAppend", "OffLoop",
           "OnLoop", "RECORD_OVERHEAD", "fill", "give_back_consumers", "consumed_frame"]

# request type -> its handler: every type of protocol.requests.REQUEST_FIELDS
HANDLERS = {
    MsgType.HELLO: session.hello,
    MsgType.CREATE: queues.create,
    MsgType.DELETE: queues.delete,
    MsgType.LIST: queues.list_queues,
    MsgType.STATS: queues.stats,
    MsgType.PURGE: queues.purge,
    MsgType.PING: session.ping,
    MsgType.BACKUP: session.backup,
    MsgType.CONSUMER_ADD: queues.consumer_add,
    MsgType.CONSUMER_REMOVE: queues.consumer_remove,
    MsgType.PRODUCE: queues.produce,
    MsgType.PRODUCE_BATCH: queues.produce_batch,
    MsgType.CONSUME: queues.consume,
    MsgType.ACK: queues.ack,
    MsgType.NACK: queues.nack,
    MsgType.EXTEND: queues.extend,
    MsgType.REJECT: queues.reject,
    MsgType.PEEK: queues.peek,
    MsgType.REDRIVE: queues.redrive,
    MsgType.SUBSCRIBE: queues.subscribe,
    MsgType.CANCEL: queues.cancel,
    MsgType.STREAM_CREATE: streams.stream_create,
    MsgType.STREAM_DELETE: streams.stream_delete,
    MsgType.STREAM_LIST: streams.stream_list,
    MsgType.STREAM_INFO: streams.stream_info,
    MsgType.STREAM_STATS: streams.stream_stats,
    MsgType.APPEND: streams.append,
    MsgType.APPEND_BATCH: streams.append_batch,
    MsgType.READ: streams.read,
    MsgType.OFFSETS: streams.offsets,
    MsgType.PUBLISH: streams.publish,
    MsgType.PUBLISHED: streams.published,
    MsgType.DELETE_RECORDS: streams.delete_records,
    MsgType.JOIN: groups.join,
    MsgType.POLL: groups.poll,
    MsgType.POLL_MANY: groups.poll_many,
    MsgType.COMMIT: groups.commit,
    MsgType.SEEK: groups.seek,
    MsgType.PAUSE: groups.pause,
    MsgType.LEAVE: groups.leave,
    MsgType.ASSIGNMENT: groups.assignment,
    MsgType.GROUPS: groups.groups,
    MsgType.COMMITTED: groups.committed,
    MsgType.LAG: groups.lag,
    MsgType.RESET: groups.reset,
    MsgType.TXN_INIT: txns.txn_init,
    MsgType.TXN_OFFSETS: txns.txn_offsets,
    MsgType.TXN_END: txns.txn_end,
    MsgType.X_CREATE: exchanges.x_create,
    MsgType.X_DELETE: exchanges.x_delete,
    MsgType.X_LIST: exchanges.x_list,
    MsgType.X_BIND: exchanges.x_bind,
    MsgType.X_UNBIND: exchanges.x_unbind,
    MsgType.X_PUBLISH: exchanges.x_publish,
    MsgType.REQUEST: exchanges.request,
    MsgType.KV_OPEN: kv.kv_open,
    MsgType.KV_LIST: kv.kv_list,
    MsgType.KV_DROP: kv.kv_drop,
    MsgType.KV_SET: kv.kv_set,
    MsgType.KV_GET: kv.kv_get,
    MsgType.KV_GET_MANY: kv.kv_get_many,
    MsgType.KV_DELETE: kv.kv_delete,
    MsgType.KV_INCR: kv.kv_incr,
    MsgType.KV_ADD: kv.kv_add,
    MsgType.KV_MEMBERS: kv.kv_members,
    MsgType.KV_EXPIRE: kv.kv_expire,
    MsgType.KV_TTL: kv.kv_ttl,
    MsgType.KV_KEYS: kv.kv_keys,
    MsgType.KV_CLEAR: kv.kv_clear,
    MsgType.KV_SWEEP: kv.kv_sweep,
}

# request type -> (check, handler) of its plain shape (``requests.PLAIN_CHECKS``): the check
# returns the fields or None (then ``check_request`` and ``HANDLERS``), the handler returns
# the reply frame (or a Wait) for ``(conn, msg_id, fields)``
PLAIN = {MsgType.PRODUCE: (PLAIN_CHECKS[MsgType.PRODUCE], queues.plain_produce),
         MsgType.CONSUME: (PLAIN_CHECKS[MsgType.CONSUME], queues.plain_consume),
         MsgType.ACK: (PLAIN_CHECKS[MsgType.ACK], queues.plain_ack)}
