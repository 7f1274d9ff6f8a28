"""The Kafka tests' own client (confluent-kafka, which is librdkafka): an independent
implementation that makes topics and reads back what Herald produced.

    kafka_consumer.py BOOTSTRAP USER PASSWORD [CA,CERT,KEY] topic NAME PARTITIONS
    kafka_consumer.py BOOTSTRAP USER PASSWORD [CA,CERT,KEY] read NAME
    kafka_consumer.py BOOTSTRAP USER PASSWORD [CA,CERT,KEY] count NAME

It authenticates with SCRAM-SHA-512 (over TLS, trusting CA and presenting the client
certificate CERT with its KEY, when those PEM files are given). `read` prints
every record of every partition, oldest first per partition, as one JSON array; `count`
prints how many records the topic holds (0 when it does not exist).
"""

import json
import os
import sys
import uuid

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def settings(bootstrap, user, password, tls):
    config = {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        "log_level": 3,
    }
    if os.environ.get("KAFKA_DEBUG"):
        config.update({"debug": os.environ["KAFKA_DEBUG"], "log_level": 7})
    if tls:
        ca, cert, key = tls.split(",")
        config.update({"ssl.ca.location": ca, "ssl.certificate.location": cert, "ssl.key.location": key})
    return config


def topic(config, name, partitions):
    admin = AdminClient(config)
    for future in admin.create_topics([NewTopic(name, num_partitions=int(partitions), replication_factor=1)]).values():
        future.result(timeout=30)
    return name


def partitions(consumer, name):
    metadata = consumer.list_topics(name, timeout=10).topics.get(name)
    if metadata is None or metadata.error is not None:
        return []
    return [TopicPartition(name, p) for p in sorted(metadata.partitions)]


def count(config, name):
    consumer = Consumer({**config, "group.id": "herald-tests-" + uuid.uuid4().hex})
    try:
        total = 0
        for tp in partitions(consumer, name):
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            total += high - low
        return total
    finally:
        consumer.close()


def read(config, name):
    # tansu answers a fetch in time proportional to the records after its offset: one
    # fetch takes the whole partition, and may take many seconds.
    consumer = Consumer({**config, "group.id": "herald-tests-" + uuid.uuid4().hex, "enable.auto.commit": False,
                         "max.partition.fetch.bytes": 50 * 1024 * 1024})
    try:
        records = []
        for tp in partitions(consumer, name):
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(name, tp.partition, low)])
            offset = low
            while offset < high:
                message = consumer.poll(60)
                if message is None:
                    raise RuntimeError(f"partition {tp.partition} stopped at {offset} of {high}")
                if message.error():
                    raise KafkaException(message.error())
                offset = message.offset() + 1
                headers = {k: (v or b"").decode() for k, v in (message.headers() or [])}
                records.append({"partition": message.partition(), "offset": message.offset(),
                                "key": (message.key() or b"").decode(), "headers": headers,
                                "body": (message.value() or b"").decode()})
        return records
    finally:
        consumer.close()


def main():
    bootstrap, user, password, *rest = sys.argv[1:]
    tls = rest.pop(0) if rest[0] not in ("topic", "read", "count") else None
    command, *args = rest
    config = settings(bootstrap, user, password, tls)
    print(json.dumps({"topic": topic, "read": read, "count": count}[command](config, *args)))


if __name__ == "__main__":
    main()
