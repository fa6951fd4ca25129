"""One consumer-group member as a subprocess, for test_groups.py.

    python group_member.py CLIENT BOOTSTRAP GROUP TOPIC

CLIENT is confluent, kafka-python or aiokafka (classic groups), or confluent-consumer[:ASSIGNOR]
(confluent-kafka with group.protocol=consumer, KIP-848; ASSIGNOR its group.remote.assignor). The
member subscribes to TOPIC in GROUP (round-robin
assignment, which all three clients speak, so that they can share one group), prints one line per
record it processes, ``rec <partition> <offset> <value>``, and commits the offsets of what it
printed synchronously after each poll (at-least-once). It also prints ``assigned <partitions>``
after every rebalance (``commit-error <name>`` for a commit the group refused). It leaves the group cleanly on SIGTERM (close), and not at all on SIGKILL.
"""

from __future__ import annotations

import asyncio
import signal
import sys

stop = False


def _term(*_):
    global stop
    stop = True


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def confluent(bootstrap, group, topic):
    from confluent_kafka import Consumer, KafkaException
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                  "heartbeat.interval.ms": 500, "partition.assignment.strategy": "roundrobin"})
    c.subscribe([topic], on_assign=lambda _c, ps: out("assigned " + ",".join(str(p.partition) for p in ps)))
    while not stop:
        msgs = [m for m in c.consume(200, 0.2) if m.error() is None]
        for m in msgs:
            out(f"rec {m.partition()} {m.offset()} {m.value().decode()}")
        if msgs:
            try:
                c.commit(asynchronous=False)
            except KafkaException as e:      # e.g. the partitions were revoked meanwhile
                out(f"commit-error {e.args[0].name()}")
    c.close()


def confluent_consumer_protocol(bootstrap, group, topic, assignor=None):
    """KIP-848 (group.protocol=consumer): the broker assigns; the callbacks get the partitions
    added or revoked (incremental), so the full assignment is printed from them."""
    from confluent_kafka import Consumer, KafkaException
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "group.protocol": "consumer"}
    if assignor:
        conf["group.remote.assignor"] = assignor
    c = Consumer(conf)
    owned: set[int] = set()

    def show():
        out("assigned " + ",".join(str(p) for p in sorted(owned)))

    def on_assign(_c, ps):
        owned.update(p.partition for p in ps)
        show()

    def on_revoke(_c, ps):
        owned.difference_update(p.partition for p in ps)
        show()

    c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    while not stop:
        msgs = [m for m in c.consume(200, 0.2) if m.error() is None]
        for m in msgs:
            out(f"rec {m.partition()} {m.offset()} {m.value().decode()}")
        if msgs:
            try:
                c.commit(asynchronous=False)
            except KafkaException as e:
                out(f"commit-error {e.args[0].name()}")
    c.close()


def kafka_python(bootstrap, group, topic):
    import kafka
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    class Listener(kafka.ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            pass

        def on_partitions_assigned(self, assigned):
            out("assigned " + ",".join(str(tp.partition) for tp in assigned))

    c = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                            auto_offset_reset="earliest", session_timeout_ms=6000,
                            heartbeat_interval_ms=500,
                            partition_assignment_strategy=[RoundRobinPartitionAssignor])
    c.subscribe([topic], listener=Listener())
    while not stop:
        polled = c.poll(timeout_ms=200)
        for _tp, msgs in polled.items():
            for m in msgs:
                out(f"rec {m.partition} {m.offset} {m.value.decode()}")
        if polled:
            c.commit()
    c.close()


def aiokafka(bootstrap, group, topic):
    import aiokafka
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    class Listener(aiokafka.ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):
            pass

        async def on_partitions_assigned(self, assigned):
            out("assigned " + ",".join(str(tp.partition) for tp in assigned))

    async def go():
        c = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                      enable_auto_commit=False, auto_offset_reset="earliest",
                                      session_timeout_ms=6000, heartbeat_interval_ms=500,
                                      partition_assignment_strategy=(RoundRobinPartitionAssignor,))
        await c.start()
        c.subscribe([topic], listener=Listener())
        try:
            while not stop:
                polled = await c.getmany(timeout_ms=200)
                for _tp, msgs in polled.items():
                    for m in msgs:
                        out(f"rec {m.partition} {m.offset} {m.value.decode()}")
                if polled:
                    await c.commit()
        finally:
            await c.stop()
    asyncio.run(go())


def main() -> int:
    client, bootstrap, group, topic = sys.argv[1:5]
    signal.signal(signal.SIGTERM, _term)
    if client.startswith("confluent-consumer"):
        # confluent-consumer[:assignor]: the KIP-848 protocol, optionally naming the assignor
        confluent_consumer_protocol(bootstrap, group, topic, client.partition(":")[2] or None)
    else:
        {"confluent": confluent, "kafka-python": kafka_python, "aiokafka": aiokafka}[client](
            bootstrap, group, topic)
    out("closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
