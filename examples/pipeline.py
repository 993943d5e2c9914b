"""An order pipeline on Spark: producers -> a shmq queue -> a streaming aggregation ->
a shmq stream -> a consumer group.

    python examples/pipeline.py                      # local[*], 20,000 orders, 3 producers
    python examples/pipeline.py --orders 100000 --producers 4

Several producer processes put orders (JSON: customer, amount, event time) on the queue
"orders". A Structured Streaming query reads the queue (through the stream that stages
it, exactly once), sums the amounts per customer in 10-second event-time windows, and
writes each updated total to the stream "order-totals" (exactly once, keyed by
customer). A consumer group reads the totals; the last total of each (customer, window)
adds up to what the producers put, to the cent. On a cluster only ``--master`` and the
broker's address change: run ``shmq server`` on the broker's host and give
``--url tcp://HOST:7878`` (docs/SPARK.md).
"""

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time

import shmq

FLUSH = "~flush"  # the customer of the last order, whose event time closes every window


def produce(namespace, url, seed, count, out):
    """Put ``count`` orders; send back the sum of their amounts in cents."""
    rnd = random.Random(seed)
    total = 0
    with shmq.connect(url, namespace=None if url else namespace) as broker:
        q = broker.queue("orders")
        start = time.time()
        for i in range(count):
            cents = rnd.randint(100, 50_000)
            total += cents
            order = {"customer": f"c{rnd.randrange(20):02d}", "cents": cents,
                     "at": start + i * 0.001 + rnd.random() * 5}  # event time: a few seconds out of order
            q.put(json.dumps(order).encode(), timeout=30)
    out.put(total)


def positive(text):
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def shares(orders, producers):
    """How many orders each producer puts: equal shares of ``orders``, the first
    ``orders % producers`` one more, so that every order the command line asks for is put."""
    return [orders // producers + (i < orders % producers) for i in range(producers)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", type=positive, default=20_000)
    ap.add_argument("--producers", type=positive, default=3)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--url", help="tcp://host:port of a shmq server (default: this host's shared memory)")
    ap.add_argument("--token")
    args = ap.parse_args(argv)

    import shmq.spark
    from pyspark.sql import functions as F

    namespace = f"pipeline{os.getpid()}"
    broker = shmq.connect(args.url, token=args.token) if args.url else shmq.connect(namespace=namespace)
    conn = {"url": args.url, "token": args.token} if args.url else {"namespace": namespace}
    conn = {k: v for k, v in conn.items() if v}
    scratch = tempfile.mkdtemp(prefix="shmq-pipeline-")
    broker.create_queue("orders", exist_ok=True)
    broker.create_stream("order-totals", partitions=2, exist_ok=True)
    spark = shmq.spark.local_session("shmq-pipeline", scratch, master=args.master)
    ctx = mp.get_context("spawn")
    sums = ctx.Queue()
    producers = [ctx.Process(target=produce, args=(namespace, args.url, i, count, sums))
                 for i, count in enumerate(shares(args.orders, args.producers))]
    try:
        for p in producers:
            p.start()
        orders = (spark.readStream.format("shmq").options(queue="orders", **conn)
                  .option("maxRecordsPerTrigger", 20_000).load()
                  .select(F.from_json(F.col("value").cast("string"),
                                      "customer string, cents long, at double").alias("o"))
                  .select("o.customer", "o.cents", F.col("o.at").cast("timestamp").alias("at")))
        totals = (orders.withWatermark("at", "30 seconds")
                  .groupBy(F.window("at", "10 seconds"), "customer")
                  .agg(F.sum("cents").alias("cents"), F.count("*").alias("orders"))
                  .select(F.col("customer").alias("key"),
                          F.to_json(F.struct("customer", F.col("window.start").cast("string").alias("window"),
                                             "cents", "orders")).alias("value")))
        query = (totals.writeStream.format("shmq").options(stream="order-totals", **conn)
                 .option("checkpointLocation", os.path.join(scratch, "checkpoint"))
                 .outputMode("append").trigger(processingTime="2 seconds").start())
        for p in producers:
            p.join()
        expected = sum(sums.get(timeout=10) for _ in producers)
        q = broker.queue("orders")
        q.put(json.dumps({"customer": FLUSH, "cents": 0, "at": time.time() + 3600}).encode())
        while True:  # until the query has read everything the queue had
            query.processAllAvailable()
            st = q.stats()
            if st.ready == 0 and st.in_flight == 0:
                query.processAllAvailable()
                break
        query.stop()

        totals = []
        with broker.stream("order-totals").consumer("report") as c:  # a consumer group reads the totals
            while batch := c.poll(max_records=10_000, timeout=1.0):
                totals += [json.loads(r.value) for r in batch]
                c.commit()
        got = sum(t["cents"] for t in totals)
        n = sum(t["orders"] for t in totals)
        assert len({(t["customer"], t["window"]) for t in totals}) == len(totals)  # each window once
        print(f"{n} orders in {len(totals)} (customer, window) totals; sum {got / 100:.2f} "
              f"(the producers put {args.orders} orders, {expected / 100:.2f})")
        return 0 if (n, got) == (args.orders, expected) else 1
    finally:
        for p in producers:
            p.kill()
        spark.stop()
        if args.url:  # what the example made on the server
            for name in broker.list_streams():
                if name.startswith(("orders:", "order-totals")):
                    broker.delete_stream(name)
            broker.delete_queue("orders")
        broker.close()
        if not args.url:  # the example's own namespace: nothing of it stays in /dev/shm
            shmq.destroy_namespace(namespace)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
