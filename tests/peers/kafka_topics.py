"""A stand-in for Kafka's ``bin/kafka-topics.sh`` for librdkafka's test programs that call
it (``--create``, ``--alter --partitions``, ``--delete``, with ``--config k=v``), through
confluent-kafka's AdminClient; ``$SHMQ_KAFKA_CONF`` (JSON) adds the client's settings
(SASL). Exit status 1 with the error on stderr, as the script's."""

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    ap = argparse.ArgumentParser(prog="kafka-topics.sh")
    ap.add_argument("--bootstrap-server", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--create", action="store_true")
    ap.add_argument("--alter", action="store_true")
    ap.add_argument("--delete", action="store_true")
    ap.add_argument("--partitions", type=int, default=-1)
    ap.add_argument("--replication-factor", type=int, default=-1)
    ap.add_argument("--config", action="append", default=[])
    a = ap.parse_args(argv)
    admin = AdminClient({"bootstrap.servers": a.bootstrap_server, **json.loads(os.environ.get("SHMQ_KAFKA_CONF", "{}"))})
    if a.create:
        configs = dict(c.split("=", 1) for c in a.config)
        futures = admin.create_topics([NewTopic(a.topic, a.partitions, a.replication_factor, config=configs)])
    elif a.alter:
        futures = admin.create_partitions([NewPartitions(a.topic, a.partitions)])
    elif a.delete:
        futures = admin.delete_topics([a.topic])
    else:
        ap.error("one of --create, --alter, --delete")
    try:
        for f in futures.values():
            f.result(30)
    except Exception as e:  # the client's error, as the script prints it
        print(f"Error while executing topic command : {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
