"""The broker process (``shmq server``): ``main`` (the process), ``tcp`` (TcpServer:
listening, connections, queue handles, stop), ``connection`` (bytes in, frames out),
``handlers`` (one function per request type), ``leases`` (a connection's deliveries),
``waiters`` (waiting CONSUMEs), ``limits`` (what clients may cost), ``housekeeper``,
``metrics`` (Prometheus /metrics, ``--metrics``), ``lock`` (one broker per namespace).
The package imports none of them, so a CLI call that needs only ``lock`` does not import
the housekeeper, the limits and asyncio."""
