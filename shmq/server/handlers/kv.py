"""The keyed stores' requests (engine/store.py, server/stores.py): KV_OPEN to KV_SWEEP;
a GET may wait for its key."""

from ...errors import MessageTooLarge
from ..waiters import NOTHING
from .answers import REPLY_RESERVE, wait_or_answer


def _store(conn, f):
    return conn.server.stores.get(f["store"])


def _fits(conn, size: int, what: str) -> None:
    """MessageTooLarge unless a reply of about ``size`` bytes fits in a frame of this server."""
    most = conn.server.max_frame_bytes - REPLY_RESERVE
    if size > most:
        raise MessageTooLarge(f"{what} takes {size} bytes, more than a reply of this server holds ({most}; "
                              "--max-frame-bytes): ask for less at a time")


def _kv_wrote(conn, f, result):
    conn.server.stores.wrote(f["store"])  # its waiting GETs look now
    return result


def kv_open(conn, f):
    _store(conn, f)
    return {}


def kv_list(conn, f):
    return {"stores": conn.server.broker.list_stores()}


def kv_drop(conn, f):
    return {"deleted": conn.server.broker.delete_store(f["store"])}


def kv_set(conn, f):
    return _kv_wrote(conn, f, {"set": _store(conn, f).set(f["key"], f["value"], f.get("ttl"), f["only_new"])})


def kv_get(conn, f):
    """GET: the value, or (``wait_ms``) a wait in the store's line for the key to be there."""
    kv = _store(conn, f)
    return wait_or_answer(conn, f, conn.server.stores.line_of, kv, _kv_take, _kv_got, (kv, f["key"]))


def _kv_take(args):
    kv, key = args
    return kv.get(key)


def _kv_got(conn, args, got):
    if got is NOTHING:
        return {"value": None}
    _fits(conn, len(got), f"the value of key {args[1]!r:.80}")
    return {"value": got}


def kv_get_many(conn, f):
    values = _store(conn, f).get_many(f["keys"])
    _fits(conn, sum(8 + len(v or b"") for v in values), f"the values of {len(values)} keys")
    return {"values": values}


def kv_delete(conn, f):
    return {"deleted": _store(conn, f).delete(*f["keys"])}


def kv_incr(conn, f):
    return _kv_wrote(conn, f, {"value": _store(conn, f).incr(f["key"], f["by"], f.get("ttl"))})


def kv_add(conn, f):
    return _kv_wrote(conn, f, {"size": _store(conn, f).add(f["key"], f["member"], f.get("ttl"))})


def kv_members(conn, f):
    members = sorted(_store(conn, f).members(f["key"]))
    _fits(conn, sum(8 + len(m.encode()) for m in members), f"the {len(members)} members of key {f['key']!r:.80}")
    return {"members": members}


def kv_expire(conn, f):
    return {"found": _store(conn, f).expire(f["key"], f["ttl"])}


def kv_ttl(conn, f):
    return {"ttl": _store(conn, f).ttl(f["key"])}


def kv_keys(conn, f):
    keys = _store(conn, f).keys(f["prefix"])
    _fits(conn, sum(8 + len(k.encode()) for k in keys), f"{len(keys)} keys")
    return {"keys": keys}


def kv_clear(conn, f):
    return {"cleared": _store(conn, f).clear()}


def kv_sweep(conn, f):
    return {"swept": _store(conn, f).sweep()}
