"""Share-group consumption against a classic consumer, side by side in one run (issue 36's
benchmark, first shape): one partition, N records of 100 bytes, then per round a classic
consumer (its own group, from the earliest offset) and one confluent-kafka ShareConsumer
(implicit acknowledgement: every record accepted on the next poll) each read all of it;
records/s from the first record received to the last.

    .venv/bin/python loadtests/bench_share.py [N]

Starts the appliance through the integration tests' harness (tests/integration/appliance_harness.py)
with ``groups.share_auto_offset_reset = "earliest"``. Not yet: 8 partitions, several share
consumers, the redelivery delay after a kill -9 (the issue's full benchmark).
"""
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "integration"))

from appliance_harness import Appliance  # noqa: E402
from client_drivers import driver  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
work = tempfile.mkdtemp(prefix="bench-share-")
a = Appliance(data_dir=os.path.join(work, "data"), log_path=os.path.join(work, "appliance.log"),
              config={"groups": {"share_auto_offset_reset": "earliest"}}, args=[], env={})
a.start()
b = a.bootstrap
try:
    driver("confluent").create_topics(b, {"q": (1, {})})
    from confluent_kafka import Producer, Consumer, ShareConsumer
    p = Producer({"bootstrap.servers": b, "linger.ms": 5})
    for i in range(N):
        p.produce("q", value=b"x" * 100, partition=0)
    p.flush(60)
    for rnd in range(2):
        c = Consumer({"bootstrap.servers": b, "group.id": f"cg{rnd}", "auto.offset.reset": "earliest"})
        c.subscribe(["q"]); n = 0; t0 = None
        while n < N:
            for m in c.consume(500, 1.0):
                if not m.error():
                    t0 = t0 or time.time(); n += 1
        classic = N / (time.time() - t0); c.close()
        s = ShareConsumer({"bootstrap.servers": b, "group.id": f"sg{rnd}"})
        s.subscribe(["q"]); n = 0; t0 = None
        while n < N:
            for m in s.poll(1.0) or []:
                if not m.error():
                    t0 = t0 or time.time(); n += 1
        share = N / (time.time() - t0); s.close()
        print(f"round {rnd}: classic {classic:.0f} rec/s, share (implicit ack) {share:.0f} rec/s, ratio {share/classic:.2f}", flush=True)
finally:
    a.terminate()
