"""What one authorization costs a frontend: the check a Produce makes once per topic.

Not a test; run by hand in the user's shell:

    .venv/bin/python loadtests/bench_authorizer.py [--acls 1000] [--checks 300000]

Builds the frontend's ``Authorizer`` over a snapshot of ``--acls`` LITERAL ACLs for 50 other
principals plus one PREFIXED ALLOW All for the producer's principal (what ``bench_produce.py
--authorizer acl`` grants), and times ``RequestContext.authorize(Write, Topic, name)``, the call
the Produce handler makes per topic of a request: with the authorizer off, the producer a super
user, allowed by an ACL (the decision cached, as after a request's first), and without the cache
(a decision from the snapshot, what the first request after an ACL change pays). CPU time
(``time.process_time``), best of 7, minus the loop's own cost; prints nanoseconds per check.

Then the whole Produce handler (``appliance.api.produce``: decode is done, validation of every
record, the authorization, the hand-off to a writer that here does nothing, acks=0) on a request
of ``--records`` 100-byte records, with each authorizer setting, interleaved rounds, the least
CPU time per request kept: what the authorizer adds to a Produce, without the network, the
client or the rest of the machine in the measurement.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from appliance.acl.authorizer import AclSnapshot, Authorizer  # noqa: E402
from appliance.acl.model import (AclBinding, AclOperation as O, AclPermissionType as A,  # noqa: E402
                                 PatternType as P, ResourceType as R)
from appliance.api import RequestContext  # noqa: E402

PRINCIPAL = "User:ANONYMOUS"


class _Page:
    """A supervisor page that never changes (the snapshot stays the same)."""
    seq = 2


class _Conn:
    principal = PRINCIPAL
    host = "127.0.0.1"
    produce_order = None          # appliance.api.produce keeps a connection's send order here


class _Broker:
    authorizer: Authorizer


def best_ns(fn, n: int, reps: int = 7) -> float:
    out = []
    for _ in range(reps):
        t = time.process_time()
        for _ in range(n):
            fn()
        out.append(time.process_time() - t)
    return min(out) / n * 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Cost of one authorization check in a frontend.")
    ap.add_argument("--acls", type=int, default=1000, help="other ACLs in the snapshot")
    ap.add_argument("--checks", type=int, default=300000, help="checks per timing")
    ap.add_argument("--records", type=int, default=1000, help="records per Produce request")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the handler timing")
    args = ap.parse_args(argv)
    from appliance.acl.store import AclView
    acls = [AclBinding(R.TOPIC, f"t{i}", P.LITERAL, f"User:u{i % 50}", "*", O.WRITE, A.ALLOW)
            for i in range(args.acls)]
    acls.append(AclBinding(R.TOPIC, "bench-", P.PREFIXED, PRINCIPAL, "*", O.ALL, A.ALLOW))
    view = AclView(os.devnull, _Page())
    view._seq, view.snapshot = _Page.seq, AclSnapshot(1, acls)
    loop = best_ns(lambda: None, args.checks)
    rows = []
    for name, authz in (("authorizer off", Authorizer(False, (), False, view)),
                        ("super user", Authorizer(True, [PRINCIPAL], False, view)),
                        ("allowed by an ACL, cached", Authorizer(True, (), False, view))):
        broker = _Broker()
        broker.authorizer = authz
        ctx = RequestContext(broker, _Conn(), None)
        rows.append((name, best_ns(lambda: ctx.authorize(O.WRITE, R.TOPIC, "bench-t"),
                                   args.checks) - loop))
    authz = Authorizer(True, (), False, view)

    def uncached():
        authz._cache.clear()
        authz.authorize(PRINCIPAL, "127.0.0.1", O.WRITE, R.TOPIC, "bench-t")
    rows.append((f"allowed by an ACL, not cached ({len(acls)} ACLs)",
                 best_ns(uncached, max(args.checks // 10, 1)) - loop))
    print("| check | ns |\n|---|---|")
    for name, ns in rows:
        print(f"| {name} | {ns:,.0f} |")
    print()
    print(produce_table(view, args.records, args.rounds))
    return 0


def produce_table(view, records: int, rounds: int) -> str:
    """The Produce handler's CPU per request, per authorizer setting."""
    from appliance.api import REGISTRY, load_handlers
    from appliance.catalog.model import Catalog, TopicInfo
    from appliance.config import Config
    import io
    from kio.serial import entity_writer
    from appliance.protocol import messages
    from appliance.protocol.produce_request import parse_produce_request
    from appliance.quota.rates import ClientQuotas
    from appliance.protocol.records import Record, build_batch
    from shm.metrics import MetricsTable
    from workers.frontend.metrics import FrontendMetrics
    load_handlers()
    handle = REGISTRY[0].handle
    batch = build_batch([Record(key=None, value=b"x" * 100) for _ in range(records)])
    kreq = messages.build(messages.request_class(0, 9), {
        "transactional_id": None, "acks": 0, "timeout_ms": 1000,
        "topic_data": [{"name": "bench-t", "partition_data": [{"index": 0, "records": batch}]}]})
    # The handler gets what the frontend's hand parser makes of the frame (views of it), not
    # kio's entity (appliance.protocol.produce_request).
    buf = io.BytesIO()
    entity_writer(type(kreq))(buf, kreq)
    req = parse_produce_request(memoryview(buf.getvalue()).toreadonly(), 0, 9)

    class Header:
        api_key, api_version = 0, 9

    class Broker:
        cfg = Config()
        catalog = Catalog(1, {"bench-t": TopicInfo("bench-t", b"t" * 16, 1)})
        counters = FrontendMetrics(MetricsTable.anonymous(256))     # as a frontend counts
        quotas = ClientQuotas()                 # none configured, as on most appliances

        def produce(self, *args):
            return None                 # acks=0: nothing to wait for

    settings = {"authorizer off": Authorizer(False, (), False, view),
                "super user": Authorizer(True, [PRINCIPAL], False, view),
                "allowed by an ACL": Authorizer(True, (), False, view)}
    best: dict[str, float] = {}
    n = max(1, 300000 // records)
    for _ in range(rounds):
        for name, authz in settings.items():
            broker = Broker()
            broker.authorizer = authz
            ctx = RequestContext(broker, _Conn(), Header())

            def one():
                # acks=0 and one partition: the handler sends at once and returns no coroutine
                # (appliance.api.produce); drive one to its end if it ever does.
                coro = handle(ctx, req)
                if coro is not None and hasattr(coro, "send"):
                    try:
                        coro.send(None)
                    except StopIteration:
                        pass
            us = best_ns(one, n, reps=3) / 1000
            best[name] = min(best.get(name, us), us)
    off = best["authorizer off"]
    lines = [f"| Produce handler, one request of {records} x 100 B | us | / authorizer off |",
             "|---|---|---|"]
    lines += [f"| {name} | {us:,.1f} | {us / off:.3f} |" for name, us in best.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
