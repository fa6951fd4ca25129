"""The redelivery delay of a share group (issue 36's second figure): how long the records a
share consumer holds take to reach another member after the holder dies (kill -9: its socket
closes) or freezes (SIGSTOP: its socket stays open, its heartbeats stop), against the group's
record lock duration.

Per round and per fault: 200 records of 100 bytes on a 1-partition topic, a fresh share group;
a holder (confluent-kafka ShareConsumer, explicit acknowledgement, never acknowledging:
tests/integration/programs/share_member.py ``hold``) takes its first batch; a taker (``accept``)
joins and drains the rest; then the fault hits the holder, and the delay is the time from the
signal to the first and to the last of the held records reaching the taker (each with delivery
count 2). Also printed: the lock's age at the signal (its acquisition to the signal), so that
"lock duration minus age" is what waiting out the lock would cost.

    .venv/bin/python loadtests/bench_share_redelivery.py [ROUNDS] [LOCK_MS]

LOCK_MS is ``[groups] share_record_lock_duration_ms`` (15,000 by default, Kafka's lowest
``group.share.record.lock.duration.ms`` without lowering its minimum; Kafka's default is 30,000);
the member session timeout stays at its 45,000 ms default, so a frozen holder's records come
back at their lock's end. Starts the appliance through the integration tests' harness.
"""
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
MEMBER = os.path.join(ROOT, "tests", "integration", "programs", "share_member.py")


class Member:
    """A share_member.py process; each ``R`` line kept with the moment it was read."""

    def __init__(self, mode, bootstrap, group, topic):
        self.proc = subprocess.Popen([sys.executable, MEMBER, mode, bootstrap, group, topic],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.got = []                          # (monotonic time, offset, delivery count)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("R "):
                _, _p, o, n, _v = line.split(maxsplit=4)
                with self.changed:
                    self.got.append((time.monotonic(), int(o), int(n)))
                    self.changed.notify_all()

    def wait_for(self, pred, timeout):
        end = time.monotonic() + timeout
        with self.changed:
            while not pred(self.got):
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError("not seen in time")
                self.changed.wait(left)
            return list(self.got)

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.kill()
        self.proc.wait(30)


def one(bootstrap, topic, fault, lock_ms):
    from confluent_kafka import Producer
    group = f"redeliver-{fault}-{uuid.uuid4().hex[:6]}"
    holder = Member("hold", bootstrap, group, topic)
    taker = None
    try:
        got = holder.wait_for(lambda g: g, 60)
        acquired_at = got[0][0]
        held = {o for _, o, _ in holder.got}
        taker = Member("accept", bootstrap, group, topic)
        # new records for the taker: its first delivery shows it is in the group and polling
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for i in range(20):
            p.produce(topic, value=f"{fault}-{i}".encode() + b"y" * 90, partition=0)
        p.flush(30)
        taker.wait_for(lambda g: g, 60)
        at = time.monotonic()
        holder.proc.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        seen = taker.wait_for(lambda g: held <= {o for _, o, n in g if n >= 2},
                              lock_ms / 1000 + 60)
        again = [t for t, o, n in seen if o in held and n >= 2]
        return len(held), at - acquired_at, min(again) - at, max(again) - at
    finally:
        holder.stop()
        if taker is not None:
            taker.stop()


def main():
    from appliance_harness import Appliance
    from client_drivers import driver
    from confluent_kafka import Producer
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    lock_ms = int(sys.argv[2]) if len(sys.argv) > 2 else 15000
    work = tempfile.mkdtemp(prefix="bench-share-redelivery-")
    a = Appliance(data_dir=os.path.join(work, "data"), log_path=os.path.join(work, "appliance.log"),
                  config={"groups": {"share_auto_offset_reset": "earliest",
                                     "share_record_lock_duration_ms": lock_ms,
                                     "share_min_record_lock_duration_ms": min(lock_ms, 15000)}},
                  args=[], env={})
    a.start()
    b = a.bootstrap
    try:
        for rnd in range(rounds):
            for fault in ("kill", "stop"):
                topic = f"redeliver-{rnd}-{fault}"
                driver("confluent").create_topics(b, {topic: (1, {})})
                p = Producer({"bootstrap.servers": b, "linger.ms": 5})
                for i in range(200):
                    p.produce(topic, value=f"r{i:09d}".encode() + b"x" * 90, partition=0)
                p.flush(30)
                n, age, first, last = one(b, topic, fault, lock_ms)
                what = "kill -9" if fault == "kill" else "SIGSTOP"
                print(f"round {rnd}: {what:8s} {n} records held, lock age at the signal "
                      f"{age * 1000:.0f} ms; redelivered after {first * 1000:.0f} ms (first) / "
                      f"{last * 1000:.0f} ms (last); lock duration {lock_ms} ms, lock left at the "
                      f"signal {lock_ms - age * 1000:.0f} ms; load {os.getloadavg()[0]:.1f}",
                      flush=True)
    finally:
        a.terminate()


if __name__ == "__main__":
    main()
