"""iceoryx2's Python bindings: zero-copy publish-subscribe in shared memory, no broker, no acks.

A case is one publish-subscribe service of byte slices (``iox2.Slice[ctypes.c_uint8]``),
lossless: ``enable_safe_overflow(False)`` and the publisher's ``RetryUntilDelivered``
(by default iceoryx2 overwrites the oldest sample when a subscriber's buffer is full).
A send loans a sample in the shared segment (``loan_slice_uninit``), copies the body
into it (``ctypes.memmove``: the bindings have no copy-send for slices) and sends it; a
receive copies the sample out into ``bytes`` and releases it. Nothing is acknowledged
and nothing is redelivered: a sample is gone once received, and one sent while no
subscriber is connected reaches nobody (a sender sends it again until one is).

``Subscriber.receive()`` never blocks. ``iceoryx2`` pairs the service with an event
service: the sender notifies after every send (after a batch of 64 in batch mode) and
the receiver, finding nothing, waits on its ``Listener``, so it does not burn a core.
``iceoryx2-poll`` is the polling variant: no events, the receiver busy-polls (a core
spent spinning while it waits), which is how iceoryx2's own benchmarks run.

Publish-subscribe hands every sample to every subscriber: there is no queue for 4
consumers to share, so only 1 -> 1 runs. Everything iceoryx2 keeps on disk goes under a
temporary directory of the run, its shared memory under a prefix of the run's own.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
import time

import iceoryx2 as iox2

from bench.adapters import SHM_DIR, Adapter, End
from bench.plan import START_TIMEOUT, queue_bytes

iox2.set_log_level_from_env_or(iox2.LogLevel.Error)  # not "No config file was loaded" in every process
PAYLOAD = iox2.Slice[ctypes.c_uint8]
MAX_BUFFER = 1024  # samples a subscriber holds: the bytes of a shmq queue of the case, at most this many
CONNECT_POLL_S = 0.001


def buffer_size(size):
    """Samples a subscriber buffers for bodies of ``size`` bytes (two batches' worth at least)."""
    return min(MAX_BUFFER, queue_bytes(size) // size)


def node(prefix, root):
    """A node of the run's own iceoryx2 configuration, without iceoryx2's signal handlers
    (the harness's SIGTERM must still end a hung process)."""
    config = iox2.config.default()
    config.global_cfg.prefix = iox2.FileName.new(prefix)
    config.global_cfg.root_path = iox2.Path.new(root + "/")
    return (iox2.NodeBuilder.new().config(config).signal_handling_mode(iox2.SignalHandlingMode.Disabled)
            .create(iox2.ServiceType.Ipc))


def pubsub_builder(n, name, size):
    return (n.service_builder(iox2.ServiceName.new(name)).publish_subscribe(PAYLOAD).enable_safe_overflow(False)
            .subscriber_max_buffer_size(buffer_size(size)).max_publishers(1).max_subscribers(1))


class Iceoryx2End(End):
    """A publisher (and a notifier) or a subscriber (and a listener); the spec is
    (prefix, root, service name, body size, wait on events)."""

    def __init__(self, spec, role):
        prefix, root, name, size, self._events = spec
        self._node = node(prefix, root)
        self._service = pubsub_builder(self._node, name, size).open()
        event = self._node.service_builder(iox2.ServiceName.new(name)).event().open() if self._events else None
        self._ports = []
        if role == "send":
            self._pub = (self._service.publisher_builder().initial_max_slice_len(size)
                         .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered).create())
            self._notifier = event.notifier_builder().create() if event else None
            self._ports += [self._pub, self._notifier]
        else:
            self._sub = self._service.subscriber_builder().buffer_size(buffer_size(size)).create()
            self._listener = event.listener_builder().create() if event else None
            self._ports += [self._sub, self._listener]

    def _publish(self, body):
        """Loan, fill, send; a sample that reached no subscriber (none connected yet) is sent again."""
        deadline = None
        while True:
            sample = self._pub.loan_slice_uninit(len(body))
            ctypes.memmove(sample.payload_ptr, body, len(body))
            if sample.assume_init().send():
                return
            deadline = deadline or time.monotonic() + START_TIMEOUT
            if time.monotonic() > deadline:
                raise TimeoutError(f"no iceoryx2 subscriber connected within {START_TIMEOUT:.0f}s")
            time.sleep(CONNECT_POLL_S)

    def send(self, body):
        self._publish(body)
        if self._notifier is not None:
            self._notifier.notify()

    def send_batch(self, bodies):
        for body in bodies:
            self._publish(body)
        if self._notifier is not None:
            self._notifier.notify()

    def _take(self):
        """The next body, or None if there is none yet."""
        sample = self._sub.receive()
        if sample is None:
            return None
        body = ctypes.string_at(sample.payload_ptr, sample.header.number_of_elements)
        sample.delete()
        return body

    def _wait(self):
        if self._listener is not None:
            self._listener.blocking_wait()  # any notification since the last wait returns at once

    def recv(self):
        while True:
            body = self._take()
            if body is not None:
                return body
            self._wait()

    def recv_batch(self, limit):
        bodies = []
        while len(bodies) < limit:
            body = self._take()
            if body is not None:
                bodies.append(body)
            elif bodies:
                break
            else:
                self._wait()
        return bodies

    def close(self):
        for port in self._ports:
            if port is not None:
                port.delete()
        self._ports = []
        self._service = self._node = None


class Iceoryx2(Adapter):
    """One publish-subscribe service (and its event service) per case, made and held by the
    parent while the case runs; iceoryx2's files under a directory of the run's own."""

    name = "iceoryx2"
    End = Iceoryx2End
    events = True  # the receiver waits on a Listener

    def __init__(self):
        self.prefix = f"iox2bench{os.getpid()}{self.name.removeprefix('iceoryx2')}_".replace("-", "")
        self.root = tempfile.mkdtemp(prefix=f"bench-{self.name}-")
        self._node = node(self.prefix, self.root)
        self._services = {}
        self._count = 0

    def make(self, ctx, size):
        self._count += 1
        name = f"bench/c{self._count}"
        held = [pubsub_builder(self._node, name, size).create()]
        if self.events:
            held.append(self._node.service_builder(iox2.ServiceName.new(name)).event().create())
        spec = (self.prefix, self.root, name, size, self.events)
        self._services[name] = held
        return spec

    def drop(self, spec):
        self._services.pop(spec[2], None)

    def unsupported(self, job):
        if job.pairs > 1:
            return "publish-subscribe gives every subscriber every sample: no queue for consumers to share"
        return None

    def close(self):
        self._services.clear()
        self._node = None
        shutil.rmtree(self.root, ignore_errors=True)
        try:
            left = sorted(n for n in os.listdir(SHM_DIR) if n.startswith(self.prefix))
        except OSError:
            left = []
        notes = []
        for name in left:
            os.unlink(os.path.join(SHM_DIR, name))
        leaked = [n for n in left if not n.endswith(".global_mgmt")]  # kept by design, one per prefix
        if leaked:
            notes.append(f"{self.name} left {len(leaked)} object(s) in {SHM_DIR} (removed): {', '.join(leaked)}")
        return notes


class Iceoryx2Poll(Iceoryx2):
    """The same, without events: the receiver busy-polls."""

    name = "iceoryx2-poll"
    events = False
