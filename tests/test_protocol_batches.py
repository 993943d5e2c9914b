"""The batch checks of ``validate_request`` (a PRODUCE_BATCH's messages, a settle's
deliveries) take one pass of C-level calls over a plain list; a list that fails it is
walked item by item. Both ways must agree, on any list: a list subclass always takes
the walk, so it is the reference."""

from hypothesis import given, settings
from hypothesis import strategies as st

from shmq.errors import ProtocolError
from shmq.protocol import Frame, MsgType, validate_request


class Walked(list):
    """A list that never takes the fast path."""


def _outcome(msg_type, payload):
    try:
        return "ok", validate_request(Frame(msg_type, 7, payload))
    except ProtocolError as e:
        return "error", (e.status, str(e))


values = st.one_of(st.binary(max_size=4), st.text(max_size=3), st.integers(-2, 2), st.booleans(), st.none(),
                   st.dictionaries(st.text(max_size=2), st.integers(0, 3) | st.binary(max_size=2), max_size=2))
messages = st.lists(
    st.one_of(
        st.fixed_dictionaries({"body": st.binary(max_size=8)}),  # the common item, most of the time
        st.dictionaries(st.sampled_from(["body", "headers", "priority", "x"]), values, max_size=3),
        values,
    ),
    max_size=12,
)


@settings(max_examples=400, deadline=None)
@given(messages)
def test_a_batch_of_messages_is_checked_alike_both_ways(items):
    fast = _outcome(MsgType.PRODUCE_BATCH, {"queue": "q", "messages": items})
    walked = _outcome(MsgType.PRODUCE_BATCH, {"queue": "q", "messages": Walked(items)})
    assert fast == walked
    if fast[0] == "ok":  # unknown keys dropped, each message a map of body (and headers); or bodies alone
        ms = fast[1]["messages"]
        assert ((ms and all(type(m) is bytes for m in ms))
                or all(set(m) <= {"body", "headers"} and "body" in m for m in ms))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.integers(-5, 2**64), st.booleans(), st.floats(), st.text(max_size=2)), max_size=10))
def test_a_list_of_deliveries_is_checked_alike_both_ways(tags):
    for msg_type in (MsgType.ACK, MsgType.NACK, MsgType.REJECT):
        fast = _outcome(msg_type, {"queue": "q", "deliveries": tags})
        assert fast == _outcome(msg_type, {"queue": "q", "deliveries": Walked(tags)})
        assert fast[0] == ("ok" if all(type(t) is int for t in tags) else "error")


def test_the_fast_path_names_the_bad_item():
    items = [{"body": b"x"}] * 500 + [{"body": "text"}] + [{"body": b"y"}] * 10
    status, why = _outcome(MsgType.PRODUCE_BATCH, {"queue": "q", "messages": items})[1]
    assert "item 500: str" in why
    status, why = _outcome(MsgType.ACK, {"queue": "q", "deliveries": [1] * 300 + [True]})[1]
    assert "item 300 is bool" in why
