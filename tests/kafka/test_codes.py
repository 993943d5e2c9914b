"""shmq's Kafka error codes are Kafka's: each of its enum's numbers is kio's (the codec
generated from Kafka's own specs), name for name, and kio writes them as its own."""

import io

from kio.schema.errors import ErrorCode as KioErrorCode
from kio.serial.writers import write_error_code

from shmq.kafka.codes import ErrorCode


def test_every_code_is_kios_number_by_kios_name():
    assert {c.name: int(c) for c in ErrorCode} == {c.name: int(KioErrorCode[c.name]) for c in ErrorCode}


def test_kio_writes_shmqs_codes_as_its_own():
    for c in ErrorCode:
        mine, theirs = io.BytesIO(), io.BytesIO()
        write_error_code(mine, c)
        write_error_code(theirs, KioErrorCode[c.name])
        assert mine.getvalue() == theirs.getvalue()
