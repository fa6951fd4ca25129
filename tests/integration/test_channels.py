"""The shm channels between processes, checked in place (white box, against the running appliance)."""

import time

from confluent_kafka import Producer

from shm.topology import Topology


def test_ack_rings_of_topics_created_after_start_are_armed(appliance):
    """Regression: frontends armed only the rings that existed when they started, so acks of
    topics created later were picked up by the 20 ms tick instead of a doorbell (21 ms per
    produce). A frontend that served no request since the topic was created arms them from its
    tick (regression: it looked at the catalog only when a request came)."""
    p = Producer({"bootstrap.servers": appliance.bootstrap})
    p.produce("late-topic", value=b"x")          # auto-created after every frontend started
    assert p.flush(30) == 0
    topo = Topology(appliance.run_dir)
    w = appliance.writer_endpoint("late-topic", 0)         # the writer process that carries it
    for fe in [x["name"] for x in appliance.workers("frontend")]:
        ring = topo.open_ring(w, fe)
        deadline = time.monotonic() + 5
        while not ring.consumer_waiting and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ring.consumer_waiting, f"ack ring {w} -> {fe} is not armed"
