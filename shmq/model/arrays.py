"""numpy arrays as messages (issue 45): what ``put_array`` sends — the array's own bytes, no copy
where they lie in one piece, and its dtype, shape and strides in a header — and what
``Delivery.array`` makes of a body again. Either transport; numpy is imported only when an
array is sent or read (the ``numpy`` extra).

The header (``ARRAY_HEADER``) is text: ``"<dtype>;<shape>;<strides>"``, e.g. ``"<f4;1024,256;1024,4"``
(numpy's ``dtype.str``; comma lists, empty for a 0-d array), so any reader of the message
sees what it holds. Spaces may follow it: padding that makes the headers encode to a multiple
of 8 bytes, so that the body, which follows them in a record, lies 8-aligned, as numpy's
fast loops want (a float32 array at an odd address was summed at a third of the speed). A
C-contiguous or Fortran-contiguous array is sent as its memory is, with its strides; any
other (a slice with steps, a transposed view) as a C-contiguous copy.
"""

from .headers import encode_headers

__all__ = ["ARRAY_HEADER", "to_message", "from_body", "meta_of"]

ARRAY_HEADER = "x-shmq-array"


def _numpy():
    try:
        import numpy
    except ImportError:  # pragma: no cover - depends on the install
        raise ImportError("arrays need numpy: pip install 'shmq[numpy]'") from None
    return numpy


def to_message(a, headers=None):
    """(body, headers) of array ``a``: its bytes as a flat byte buffer (a view of its own
    memory when that is one piece, else a C-ordered copy) and ``headers`` plus the array
    header. TypeError for what is not an array of plain values (objects, or a dtype numpy
    cannot name in a string)."""
    np = _numpy()
    if not isinstance(a, np.ndarray):
        raise TypeError(f"put_array takes a numpy array, not {type(a).__name__}")
    dtype = a.dtype
    if dtype.hasobject or np.dtype(dtype.str) != dtype:
        raise TypeError(f"put_array: a dtype of plain values is needed, not {dtype!r}")
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        a = np.ascontiguousarray(a)
    meta = f"{dtype.str};{','.join(map(str, a.shape))};{','.join(map(str, a.strides))}"
    body = memoryview(a.ravel(order="K")).cast("B") if a.size else b""  # (its memory as it lies: no copy)
    if headers is None:
        headers = {}
    elif not isinstance(headers, dict):
        raise TypeError(f"headers must be a map, not {type(headers).__name__}")
    return body, _aligned(headers, meta)


def _aligned(headers, meta):
    """``headers`` and the array header ``meta``, spaces after it so that they encode to a
    multiple of 8 bytes (the module's docstring: the body's alignment); a few encodes at most
    (a space more may lengthen the string's own prefix)."""
    pad = 0
    for _ in range(16):
        out = {**headers, ARRAY_HEADER: meta + " " * pad}
        more = -len(encode_headers(out)) % 8
        if not more:
            break
        pad += more
    return out


def meta_of(headers) -> str:
    """The array header of a message's ``headers``; TypeError when it carries no array."""
    meta = headers.get(ARRAY_HEADER) if headers else None
    if type(meta) is not str:
        raise TypeError("this message holds no array (it was not sent with put_array)")
    return meta


def from_body(meta: str, buf, copy: bool = False):
    """The array header ``meta`` and body ``buf`` (bytes, or a read-only view) as an ndarray:
    a view of ``buf`` (read-only where ``buf`` is), or with ``copy`` an array of its own."""
    np = _numpy()
    try:
        dtype, shape, strides = meta.rstrip(" ").split(";")
        dtype = np.dtype(dtype)
        shape = tuple(int(x) for x in shape.split(",") if x)
        strides = tuple(int(x) for x in strides.split(",") if x)
        a = np.ndarray(shape, dtype, buffer=buf, strides=strides)
    except (ValueError, TypeError) as e:
        with memoryview(buf) as view:
            n = view.nbytes
        raise ValueError(f"the array header {meta!r} does not describe the body of {n} bytes: {e}") from None
    return a.copy() if copy else a
