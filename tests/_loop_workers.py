"""Worker processes of tests/test_consume_loop_processes.py (spawned: importable top-level functions)."""

import threading

import shmq
from shmq.engine.shm import cpaths


def loop_consumer(namespace, queue, impl, out_path, held=None, hold_at=None):
    """Consume ``queue`` with ``q.messages()`` (on the C paths or the Python ones: ``impl``)
    until a b"stop" message, acked as the loop's ``with`` block ends; each body handled is
    written to ``out_path``, a line each, flushed. The application settles some itself
    (``settled_by_app``). With ``hold_at``: at that body, set ``held`` and keep the delivery
    in hand until killed."""
    cpaths.set_enabled(impl == "fast")
    broker = shmq.connect(namespace=namespace)
    q = broker.queue(queue)
    with open(out_path, "w") as out, q.messages(timeout=60) as loop:
        for d in loop:
            if d.body == b"stop":
                break
            out.write(d.body.decode() + "\n")
            out.flush()
            how = settled_by_app(int(d.body[1:]), d.attempt)
            if how:
                getattr(d, how)()
            if d.body == hold_at:
                held.set()
                threading.Event().wait(120)  # the test SIGKILLs this process here
                raise AssertionError("not killed")
    q.close()
    broker.close()


def settled_by_app(i, attempt):
    """How the application settles message ``i`` at ``attempt`` itself ("reject", "nack"), or
    None: the loop acks it."""
    if i % 10 == 9:
        return "reject"
    if i % 7 == 6 and attempt == 1:
        return "nack"
    return None
