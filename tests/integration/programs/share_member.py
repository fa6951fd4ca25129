"""A share-group member (KIP-932) in its own process, for tests/integration/test_share_groups.py:
confluent-kafka's ShareConsumer on one topic.

    share_member.py MODE BOOTSTRAP GROUP TOPIC [MAX_POLL_RECORDS [KEY=VALUE ...]]

MODE: ``implicit`` (the default acknowledgement mode: a poll accepts what the last one returned);
``accept`` / ``release`` / ``reject``: explicit mode, each record acknowledged with that type and
committed (commit_sync) after each poll; ``hold``: explicit mode, nothing ever acknowledged (the
test kills it -9 with its records locked). Prints one line per record delivered:
``R <partition> <offset> <delivery count> <value>``, flushed, after the acknowledgement was
committed (for ``accept``/``reject``/``release``) or before it (implicit, hold).
"""

import sys

from confluent_kafka import ShareConsumer
from confluent_kafka import AcknowledgeType


def main() -> int:
    mode, bootstrap, group, topic = sys.argv[1:5]
    explicit = mode != "implicit"
    conf = {"bootstrap.servers": bootstrap, "group.id": group}
    if len(sys.argv) > 5:
        conf["max.poll.records"] = int(sys.argv[5])
    for kv in sys.argv[6:]:                  # more client settings
        k, _, v = kv.partition("=")
        conf[k] = v
    if explicit:
        conf["share.acknowledgement.mode"] = "explicit"
    c = ShareConsumer(conf)
    c.subscribe([topic])
    ack = {"accept": AcknowledgeType.ACCEPT, "release": AcknowledgeType.RELEASE,
           "reject": AcknowledgeType.REJECT}.get(mode)
    print("READY", flush=True)
    while True:
        msgs = c.poll(1.0)
        if not msgs:
            continue
        lines = []
        for m in msgs:
            if m.error():
                continue
            count = m.delivery_count()
            lines.append(f"R {m.partition()} {m.offset()} {count} {m.value().decode()}")
            if ack is not None:
                c.acknowledge(m, ack)
        if ack is not None:
            c.commit_sync()
        for line in lines:
            print(line, flush=True)
        if mode == "hold" and lines:
            sys.stdin.read()          # holds its records until the test kills it


if __name__ == "__main__":
    sys.exit(main())
