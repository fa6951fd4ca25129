"""One share consumer of the chaos suite's share-queue workload (``chaos_share.py``), in a process
of its own so that the workload can kill it -9 mid-batch: confluent-kafka's ShareConsumer
(KIP-932) in explicit mode, every record ACCEPTed and committed (commit_sync) after each poll.

    chaos_share_member.py BOOTSTRAP GROUP TOPIC

Prints, flushed, one line per record: ``D <partition> <offset> <delivery count> <value>`` when a
poll returns it, ``T ...`` just before the commit that sends its ACCEPT (killed during the commit,
the accept may have been applied without anyone learning it), then after the commit ``A ...``
(the broker answered the partition's acknowledgement without error: the accept is confirmed)
or ``F ...`` (an error, or no answer: whether it was applied is unknown).
"""

import sys

from confluent_kafka import AcknowledgeType, KafkaException, ShareConsumer


def main() -> int:
    bootstrap, group, topic = sys.argv[1:4]
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                       "share.acknowledgement.mode": "explicit", "max.poll.records": 50,
                       "log_level": 0, "reconnect.backoff.max.ms": 1000})
    c.subscribe([topic])
    print("READY", flush=True)
    while True:
        try:
            msgs = c.poll(1.0)
        except KafkaException:
            continue
        got = [m for m in msgs or () if not m.error()]
        if not got:
            continue
        lines = [f"{m.partition()} {m.offset()} {m.delivery_count()} {m.value().decode()}" for m in got]
        print("".join(f"D {line}\n" for line in lines), end="", flush=True)
        for m in got:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        print("".join(f"T {line}\n" for line in lines), end="", flush=True)
        try:
            res = c.commit_sync(30)
        except KafkaException:
            res = None
        ok = set()
        for tp, err in (res or {}).items():
            if err is None:
                ok.add(tp.partition)
        print("".join(f"{'A' if m.partition() in ok else 'F'} {line}\n"
                      for m, line in zip(got, lines)), end="", flush=True)


if __name__ == "__main__":
    sys.exit(main())
