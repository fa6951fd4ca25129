"""The harness's port picks: an appliance's port is never one the kernel can hand to anything else.

Regression: ``test_lost_produce_responses_leave_every_record_exactly_once`` failed in CI when the
test's proxy, bound to port 0, got the very port just picked for the appliance behind it.
"""

import socket

from appliance_harness import free_port
from ports import ephemeral_floor


def test_lost_produce_responses_proxy_cannot_take_the_appliance_port():
    floor = ephemeral_floor()
    assert floor > 12000, "this machine's ephemeral range leaves no room below it"
    picked = [free_port() for _ in range(20)]
    assert all(p < floor for p in picked), picked
    assert len(set(picked)) == len(picked), "a port was handed out twice"
    held = []
    try:
        for _ in range(200):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
            assert s.getsockname()[1] not in picked
    finally:
        for s in held:
            s.close()


def test_a_picked_port_can_be_listened_on():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen(1)
