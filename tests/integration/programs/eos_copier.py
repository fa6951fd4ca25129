"""An exactly-once copier process (consume-transform-produce, KIP-98 + KIP-447), run by
test_eos_copier.py as a subprocess so that it can be killed with SIGKILL.

    python eos_copier.py BOOTSTRAP GROUP INPUT OUTPUT TRANSACTIONAL_ID [IDLE_EXIT_S [BATCH [PAUSE_S]]]

A confluent-kafka consumer in GROUP (subscription, read_committed, no auto commit) reads INPUT; for
each poll it begins a transaction, produces every record to the same partition of OUTPUT (value
unchanged, key unchanged), sends the consumed positions with ``send_offsets_to_transaction`` and
the consumer's group metadata (generation, member id: KIP-447 fencing), and commits. On an
abortable error it aborts and rewinds to the last committed offsets; on a fatal one (fenced) it
exits 3. It exits 0 after IDLE_EXIT_S seconds without input (default 0: never). BATCH (500)
caps the records per transaction and PAUSE_S (0) sleeps after each commit, so that a test can
stretch the copy over its failure injections. With ``EOS_COPIER_GROUP_PROTOCOL=consumer`` in
the environment the consumer uses the KIP-848 protocol (``group.protocol=consumer``).

The shape of Kafka's own TransactionalMessageCopier (the tool of its transactions system test).
"""

from __future__ import annotations

import os
import sys
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition


def main() -> int:
    bootstrap, group, src, dst, tid = sys.argv[1:6]
    idle_exit = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    batch = int(sys.argv[7]) if len(sys.argv) > 7 else 500
    pause = float(sys.argv[8]) if len(sys.argv) > 8 else 0.0
    conf = {"bootstrap.servers": bootstrap, "group.id": group,
            "isolation.level": "read_committed", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "max.poll.interval.ms": 60000}
    if os.environ.get("EOS_COPIER_GROUP_PROTOCOL") == "consumer":
        # KIP-848: the broker assigns and times sessions out; the member epoch fences zombies
        conf["group.protocol"] = "consumer"
    else:
        conf.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                     "partition.assignment.strategy": "roundrobin"})
    consumer = Consumer(conf)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                         "linger.ms": 5, "transaction.timeout.ms": 10000,
                         "message.timeout.ms": 10000})
    producer.init_transactions(60)
    consumer.subscribe([src])
    last_input = time.monotonic()
    copied = 0
    while True:
        msgs = consumer.consume(batch, 0.5)
        msgs = [m for m in msgs if m.error() is None]
        if not msgs:
            if idle_exit and time.monotonic() - last_input > idle_exit:
                break
            continue
        last_input = time.monotonic()
        try:
            producer.begin_transaction()
            for m in msgs:
                while True:
                    try:
                        producer.produce(dst, key=m.key(), value=m.value(), partition=m.partition())
                        break
                    except BufferError:
                        producer.poll(0.05)
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
            copied += len(msgs)
            if pause:
                time.sleep(pause)
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if err.fatal():
                print(f"fatal: {err}", file=sys.stderr, flush=True)
                return 3
            print(f"aborting after: {err}", file=sys.stderr, flush=True)
            try:
                producer.abort_transaction(30)
            except KafkaException as e2:
                if e2.args[0].fatal():
                    return 3
            # Rewind to what the group committed, so the aborted records are copied again.
            committed = consumer.committed(consumer.assignment(), 30)
            for tp in committed:
                consumer.seek(TopicPartition(tp.topic, tp.partition,
                                             tp.offset if tp.offset >= 0 else 0))
    print(f"copied {copied}", flush=True)
    consumer.close()
    producer.flush(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
