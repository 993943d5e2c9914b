"""``_frames.h``, frames.py's constants for C (the header's, the OK status, the request types), is
generated (as the engine's ``_layout.h`` is): the codec's C half (``protocol/_wire.h``) and the
extensions that include it (``protocol/_wire.c``, ``server/_plain.c``) write none of them by hand."""

import os
import re

from shmq import mirrors
from shmq.protocol import frames


def test_the_c_sources_copy_nothing_of_frames():
    """(tests/test_mirrors.py holds _frames.h fresh.)"""
    protocol = os.path.dirname(mirrors.path("protocol/_frames.h"))
    wire_h = open(os.path.join(protocol, "_wire.h")).read()
    assert '#include "_frames.h"' in wire_h
    for path in ("_wire.h", "_wire.c", os.path.join("..", "server", "_plain.c")):
        source = open(os.path.join(protocol, path)).read()
        assert not re.search(r"#define (WIRE_MAGIC|WIRE_VERSION|WIRE_HEADER|WIRE_REPLY_BIT|WIRE_OK|MSG_\w+|T_[A-Z]+)\b",
                             source), f"a constant of frames.py copied by hand into {path}"
        assert not re.search(r"\b(t|type) [=!]= 0x", source), f"a literal request type in {path}"


def test_every_request_type_has_its_define():
    text = frames.c_header()
    got = {m[1]: int(m[2], 16) for m in re.finditer(r"#define MSG_(\w+) 0x([0-9A-F]+)", text)}
    assert got == {t.name: t.value for t in frames.MsgType}
    assert f"#define WIRE_MAGIC 0x{frames.MAGIC:X}u" in text and f"#define WIRE_HEADER {frames.HEADER_SIZE}" in text
