"""The consumer-group APIs of the Kafka listener (``HANDLERS``, ``VERSIONS``): each reads
its request, asks the listener's ``coordinator.Coordinator`` and describes the answer
(FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
DescribeGroups, ListGroups, DeleteGroups, OffsetDelete)."""

import datetime
from typing import Any, Callable

from ...kafka import ErrorCode as E
from ...kafka import build
from ...kafka.codes import authorized_operations
from ...kafka.messages import response_class
from .coordinator import GroupError

__all__ = ["HANDLERS", "VERSIONS"]


# ---------------------------------------------------------------------- kio responses
def _respond(request: Any, **values) -> Any:
    """The response to ``request``, of its version (``build`` leaves out what it lacks)."""
    return build(response_class(request.__api_key__, request.__version__), values)


def _version(request: Any) -> int:
    return int(type(request).__version__)


def _ms(value) -> int:
    return int(value / datetime.timedelta(milliseconds=1)) if isinstance(value, datetime.timedelta) else int(value)


# ---------------------------------------------------------------------- handlers
async def find_coordinator(ctx, header, request):
    srv = ctx.server
    where = {"node_id": srv.node_id, "host": srv.advertised_host, "port": srv.port}

    def one(key_type):
        if key_type in (0, 1):  # a group's coordinator, a transactional id's
            return where
        return {"node_id": -1, "host": "", "port": -1, "error_code": E.invalid_request,
                "error_message": f"key type {key_type}: 0 (a group) or 1 (a transactional id)"}

    if _version(request) >= 4:
        return _respond(request, coordinators=[{"key": k, **one(request.key_type)} for k in request.coordinator_keys])
    return _respond(request, **one(getattr(request, "key_type", 0)))


async def join_group(ctx, header, request):
    version = _version(request)
    session = _ms(request.session_timeout)
    try:
        got = await ctx.server.coordinator.join(
            request.group_id, request.member_id, getattr(request, "group_instance_id", None), request.protocol_type,
            [(p.name, p.metadata) for p in request.protocols], session,
            _ms(request.rebalance_timeout) if version >= 1 else session, ctx.client_id or "", _host(ctx),
            version >= 4)
    except GroupError as e:
        member_id = str(e) if e.code == E.member_id_required else request.member_id
        return _respond(request, error_code=e.code, generation_id=-1, member_id=member_id)
    members = [{"member_id": mid, "group_instance_id": iid, "metadata": meta} for mid, iid, meta in got["members"]]
    return _respond(request, **{**got, "members": members})


async def sync_group(ctx, header, request):
    try:
        assignment = await ctx.server.coordinator.sync(
            request.group_id, request.generation_id, request.member_id, getattr(request, "group_instance_id", None),
            getattr(request, "protocol_type", None), getattr(request, "protocol_name", None),
            {a.member_id: a.assignment for a in request.assignments})
    except GroupError as e:
        return _respond(request, error_code=e.code)
    g = ctx.server.coordinator.groups[request.group_id]
    return _respond(request, protocol_type=g.protocol_type, protocol_name=g.protocol, assignment=assignment)


async def heartbeat(ctx, header, request):
    try:
        ctx.server.coordinator.heartbeat(request.group_id, request.generation_id, request.member_id,
                                         getattr(request, "group_instance_id", None))
    except GroupError as e:
        return _respond(request, error_code=e.code)
    return _respond(request)


async def leave_group(ctx, header, request):
    if _version(request) < 3:
        (code,) = ctx.server.coordinator.leave(request.group_id, [(request.member_id, None)])
        return _respond(request, error_code=code)
    leaving = [(m.member_id, m.group_instance_id) for m in request.members]
    codes = ctx.server.coordinator.leave(request.group_id, leaving)
    return _respond(request, members=[{"member_id": mid, "group_instance_id": iid, "error_code": code}
                                      for (mid, iid), code in zip(leaving, codes)])


async def offset_commit(ctx, header, request):
    topics = {t.name: [(p.partition_index, p.committed_offset, p.committed_metadata,
                        getattr(p, "committed_leader_epoch", -1)) for p in t.partitions] for t in request.topics}
    got = ctx.server.coordinator.commit(request.group_id, request.generation_id_or_member_epoch, request.member_id,
                                        getattr(request, "group_instance_id", None), topics)
    return _respond(request, topics=[{"name": t, "partitions": [{"partition_index": p, "error_code": code}
                                                                for p, code in parts]} for t, parts in got.items()])


def _fetched(server, group_id, topics, stable) -> list:
    """OffsetFetch's topics; ``stable`` (require_stable, KIP-447): a partition whose offset
    an open transaction holds answers UNSTABLE_OFFSET_COMMIT (the client asks again)."""
    wanted = None if topics is None else [(t.name, list(t.partition_indexes)) for t in topics]
    pending = server.txns.pending(group_id) if stable else ()
    return [{"name": t, "partitions": [
        {"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1, "metadata": "",
         "error_code": E.unstable_offset_commit} if (t, p) in pending else
        {"partition_index": p, "committed_offset": o, "committed_leader_epoch": epoch, "metadata": meta,
         "error_code": E.none} for p, o, meta, epoch in parts]}
            for t, parts in server.coordinator.fetch(group_id, wanted).items()]


async def offset_fetch(ctx, header, request):
    srv = ctx.server
    stable = getattr(request, "require_stable", False)
    if _version(request) >= 8:
        return _respond(request, groups=[{"group_id": g.group_id, "topics": _fetched(srv, g.group_id, g.topics, stable),
                                          "error_code": E.none} for g in request.groups])
    return _respond(request, topics=_fetched(srv, request.group_id, request.topics, stable))


async def describe_groups(ctx, header, request):
    c = ctx.server.coordinator
    native = c.native_groups()
    ops = authorized_operations("group", getattr(request, "include_authorized_operations", False))
    return _respond(request, groups=[{"group_id": gid, "authorized_operations": ops, **c.describe(gid, native)}
                                     for gid in request.groups])


async def list_groups(ctx, header, request):
    states = {s.lower() for s in getattr(request, "states_filter", ()) or ()}
    kinds = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
    rows = [(gid, ptype, state) for gid, ptype, state in ctx.server.coordinator.listing()
            if (not states or state.lower() in states) and (not kinds or "classic" in kinds)]
    return _respond(request, groups=[{"group_id": gid, "protocol_type": ptype, "group_state": state,
                                      "group_type": "classic"} for gid, ptype, state in rows])


async def delete_groups(ctx, header, request):
    c = ctx.server.coordinator
    return _respond(request, results=[{"group_id": gid, "error_code": c.delete(gid)} for gid in request.groups_names])


async def offset_delete(ctx, header, request):
    code, got = ctx.server.coordinator.delete_offsets(
        request.group_id, {t.name: [p.partition_index for p in t.partitions] for t in request.topics})
    if code != E.none:
        return _respond(request, error_code=code)
    return _respond(request, topics=[{"name": t, "partitions": [{"partition_index": p, "error_code": e}
                                                                for p, e in parts]} for t, parts in got.items()])


def _host(ctx) -> str:
    peer = getattr(ctx, "peer", None)
    return f"/{peer[0]}" if isinstance(peer, tuple) and peer else str(peer or "")


# api key -> async handler(ctx, header, request) -> response
HANDLERS: dict[int, Callable[..., Any]] = {
    8: offset_commit, 9: offset_fetch, 10: find_coordinator, 11: join_group, 12: heartbeat, 13: leave_group,
    14: sync_group, 15: describe_groups, 16: list_groups, 42: delete_groups, 47: offset_delete,
}
# api key -> (min version, max version) answered here (OffsetCommit/Fetch v10 name topics by id: not offered)
VERSIONS: dict[int, tuple[int, int]] = {
    8: (2, 9), 9: (1, 9), 10: (0, 5), 11: (0, 9), 12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 5), 16: (0, 5),
    42: (0, 2), 47: (0, 0),
}
