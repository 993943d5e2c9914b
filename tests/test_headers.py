"""The headers codec (shmq/model/headers.py): a dict is a msgpack map, as it always was;
a stream record's list of (key, value) pairs that a dict cannot hold (a key repeated, a
None value) is an array of pairs, read back as the list, in order."""

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shmq
from shmq.model.headers import (MAX_HEADERS_BYTES, decode_headers, encode_headers, encode_record_headers,
                                from_pairs, header_pairs)

_values = st.one_of(st.text(max_size=8), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False),
                    st.booleans(), st.binary(max_size=8))
_keys = st.text(max_size=4)


def _typed(headers):
    """Headers with each value's type beside it (True == 1, 0.0 == -0.0: not the same header)."""
    return [(k, type(v), repr(v)) for k, v in header_pairs(headers)]


@given(st.dictionaries(_keys, _values, max_size=6))
def test_a_dict_round_trips_as_a_map(headers):
    raw = encode_headers(headers)
    assert encode_record_headers(headers) == raw
    assert raw == (msgpack.packb(headers, use_bin_type=True) if headers else b"")
    back = decode_headers(raw)
    assert type(back) is dict and _typed(back) == _typed(headers)


@given(st.lists(st.tuples(_keys, st.one_of(st.none(), _values)), max_size=6))
def test_a_list_of_pairs_round_trips_as_the_dict_it_fits_or_as_itself(pairs):
    back = decode_headers(encode_record_headers(pairs))
    keys = [k for k, _v in pairs]
    if len(set(keys)) == len(keys) and all(v is not None for _k, v in pairs):
        assert type(back) is dict and _typed(back) == _typed(pairs)  # what a dict holds is stored as one
    else:
        assert type(back) is list and _typed(back) == _typed(pairs)
        assert all(type(p) is tuple for p in back)
    assert decode_headers(encode_record_headers([list(p) for p in pairs])) == back  # pairs as lists (the wire's)


def test_the_forms_and_their_bytes():
    pairs = [("a", b"1"), ("a", b"2"), ("n", None)]
    raw = encode_record_headers(pairs)
    assert raw == msgpack.packb([["a", b"1"], ["a", b"2"], ["n", None]], use_bin_type=True)
    assert decode_headers(raw) == pairs
    assert encode_record_headers([("b", 1), ("a", "x")]) == encode_headers({"b": 1, "a": "x"})  # a map
    assert list(decode_headers(encode_record_headers([("b", 1), ("a", "x")]))) == ["b", "a"]  # in order
    assert encode_record_headers([]) == encode_record_headers(()) == encode_record_headers(None) == b""
    assert decode_headers(b"") == {}
    assert from_pairs([("a", None)]) == [("a", None)] and from_pairs([("a", b"")]) == {"a": b""}


def test_bad_headers_are_refused_in_clear_words():
    with pytest.raises(TypeError, match="headers must be a dict, not list"):
        encode_headers([("a", b"1")])  # a queue's headers are a dict
    with pytest.raises(TypeError, match="headers must be a dict or a list of \\(key, value\\) pairs, not str"):
        encode_record_headers("a=1")
    with pytest.raises(TypeError, match="a list of headers holds \\(key, value\\) pairs, not \\('a',\\)"):
        encode_record_headers([("a",)])
    with pytest.raises(TypeError, match="header keys must be str, not bytes"):
        encode_record_headers([(b"a", None)])
    with pytest.raises(TypeError, match="header 'a': values must be str, int, float, bool or bytes, not dict"):
        encode_record_headers([("a", {}), ("a", None)])
    with pytest.raises(ValueError, match="header 'a': integer 18446744073709551616 does not fit in 64 bits"):
        encode_record_headers([("a", 2**64), ("a", None)])
    with pytest.raises(TypeError, match="values must be str, int, float, bool or bytes, not NoneType"):
        encode_headers({"a": None})
    with pytest.raises(shmq.MessageTooLarge, match=f"the limit is {MAX_HEADERS_BYTES}"):
        encode_record_headers([("a", b"x" * 40_000), ("a", b"y" * 40_000)])
