"""KIP-932 share groups with a real client: confluent-kafka's ShareConsumer (librdkafka's
preview share consumer), each member its own process (``programs/share_member.py``), against the
real appliance.

- several members on one partition share its records: every record delivered, none twice;
- RELEASE redelivers a record (delivery count 1, 2, ...) until
  ``groups.share_delivery_count_limit``, then it is archived; REJECT archives at once: a member
  that accepts gets none of them afterwards;
- a member killed -9 with records acquired: they go to another member with delivery count 2,
  when its connection closes (Kafka's share-session disconnect listener), long before their lock
  (``groups.share_record_lock_duration_ms``) or the member's session timeout would end;
- kill -9 of the coordinator worker (which owns the share partitions' state): what was accepted
  is never delivered again, what was acquired but not acknowledged is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid

from client_drivers import driver
from java_programs import java4_program  # noqa: F401 (fixture)
from raw_wire import RawClient
from test_groups import wait_until

MEMBER = os.path.join(os.path.dirname(__file__), "programs", "share_member.py")
LOCK_MS = 3000
CONFIG = {"groups": {"share_record_lock_duration_ms": LOCK_MS, "share_heartbeat_interval_ms": 500,
                     "share_session_timeout_ms": 6000, "share_auto_offset_reset": "earliest",
                     "share_delivery_count_limit": 3}}


def uid(*parts) -> str:
    return "-".join(str(p) for p in parts) + "-" + uuid.uuid4().hex[:6]


class ShareMember:
    """A programs/share_member.py subprocess; its ``R`` lines collected by a thread."""

    def __init__(self, mode: str, bootstrap: str, group: str, topic: str,
                 max_poll_records: int | None = None, **conf: str) -> None:
        args = [sys.executable, MEMBER, mode, bootstrap, group, topic]
        if max_poll_records is not None or conf:
            args.append(str(max_poll_records or 500))
        args += [f"{k.replace('_', '.')}={v}" for k, v in conf.items()]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=None if os.environ.get("SHARE_MEMBER_STDERR") else subprocess.DEVNULL, text=True)
        self.records: list[tuple[int, int, int, str]] = []     # partition, offset, count, value
        self.lock = threading.Lock()
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("READY"):
                self.ready.set()
            elif line.startswith("R "):
                _, p, o, n, v = line.split(maxsplit=4)
                with self.lock:
                    self.records.append((int(p), int(o), int(n), v.strip()))

    def values(self) -> list[str]:
        with self.lock:
            return [v for _, _, _, v in self.records]

    def got(self) -> list[tuple[int, int, int, str]]:
        with self.lock:
            return list(self.records)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def produce(bootstrap: str, topic: str, start: int, n: int) -> list[str]:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    values = [f"r{i}" for i in range(start, start + n)]
    for v in values:
        p.produce(topic, value=v.encode(), partition=0)
    assert p.flush(30) == 0
    return values


def describe(bootstrap: str, group: str):
    with RawClient(bootstrap) as c:
        r = c.request(77, 1, {"group_ids": [group], "include_authorized_operations": False})
    (g,) = r.groups
    return g


def members_in(bootstrap: str, group: str) -> int:
    g = describe(bootstrap, group)
    return len(g.members) if g.error_code == 0 else 0


def test_share_members_split_one_partition_each_record_once(appliance_factory):
    a = appliance_factory(**CONFIG)
    b = a.bootstrap
    topic, group = uid("share"), uid("sg")
    driver("confluent").create_topics(b, {topic: (1, {})})
    members = [ShareMember("implicit", b, group, topic, 10) for _ in range(3)]
    try:
        wait_until(lambda: members_in(b, group) == 3, 60, "three members in the share group")
        g = describe(b, group)
        assert (g.group_state, g.assignor_name) == ("Stable", "simple"), g
        assert all(len(m.assignment.topic_partitions) == 1 for m in g.members), g
        sent = produce(b, topic, 0, 300)
        wait_until(lambda: sorted(v for m in members for v in m.values()) == sorted(sent), 60,
                   "every record delivered")
        got = [v for m in members for v in m.values()]
        assert len(got) == len(set(got)) == 300, "a record was delivered twice"
        assert sum(1 for m in members if m.values()) >= 2, "one member got every record"
    finally:
        for m in members:
            m.kill()


def test_regression_records_acquired_past_a_small_fetch_max_bytes_were_never_delivered(
        appliance_factory):
    """librdkafka 0171 fetch_max_bytes_small: ten 1,000-byte records, one batch each, and a
    member with fetch.max.bytes 1500. Each ShareFetch acquired every record but carried one
    batch; the other nine went out acquired without their records and were never delivered
    (one of ten read in 60 s). Now every record comes, each once, at its first delivery."""
    a = appliance_factory(**CONFIG)
    b = a.bootstrap
    topic, group = uid("share-small"), uid("sg")
    driver("confluent").create_topics(b, {topic: (1, {})})
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": b, "linger.ms": 0, "batch.num.messages": 1})
    sent = []
    for i in range(10):
        sent.append(f"s{i}")
        p.produce(topic, value=f"s{i}".ljust(1000, ".").encode(), partition=0)
        p.flush(30)                       # one batch a record
    m = ShareMember("implicit", b, group, topic, fetch_max_bytes="1500")
    try:
        wait_until(lambda: len(m.values()) >= 10, 60, "all ten records delivered")
        got = m.got()
        assert sorted(v.rstrip(".") for v in m.values()) == sorted(sent), got
        assert [n for _, _, n, _ in got] == [1] * 10, got       # none counted twice
    finally:
        m.kill()


def test_share_release_redelivers_until_the_delivery_limit_and_reject_archives(appliance_factory):
    a = appliance_factory(**CONFIG)
    b = a.bootstrap
    topic = uid("share")
    driver("confluent").create_topics(b, {topic: (1, {})})
    released, rejected = uid("release"), uid("reject")
    sent = produce(b, topic, 0, 5)
    rel = ShareMember("release", b, released, topic)
    rej = ShareMember("reject", b, rejected, topic)
    try:
        limit = CONFIG["groups"]["share_delivery_count_limit"]
        wait_until(lambda: len(rel.values()) == limit * len(sent), 60,
                   "each released record delivered up to the limit")
        wait_until(lambda: sorted(rej.values()) == sorted(sent), 60, "the rejected records")
        counts: dict[str, list[int]] = {}
        for _, _, n, v in rel.got():
            counts.setdefault(v, []).append(n)
        assert counts == {v: list(range(1, limit + 1)) for v in sent}, counts
        assert all(n == 1 for _, _, n, _ in rej.got())
    finally:
        rel.kill()
        rej.kill()
    # Archived in both groups: members that accept get only what comes next.
    more = produce(b, topic, 5, 3)
    takers = [ShareMember("accept", b, g, topic) for g in (released, rejected)]
    try:
        for t in takers:
            wait_until(lambda: sorted(t.values()) == sorted(more), 60, "only the new records")
        assert all(n == 1 for t in takers for _, _, n, _ in t.got())
    finally:
        for t in takers:
            t.kill()


def test_share_member_killed_mid_batch_has_its_records_redelivered_after_the_lock(
        appliance_factory):
    a = appliance_factory(**CONFIG)
    b = a.bootstrap
    topic, group = uid("share"), uid("sg")
    driver("confluent").create_topics(b, {topic: (1, {})})
    sent = produce(b, topic, 0, 20)
    holder = ShareMember("hold", b, group, topic)
    try:
        wait_until(lambda: holder.values(), 60, "the holder's batch")
        held = holder.values()
        holder.kill()
        taker = ShareMember("accept", b, group, topic)
        wait_until(lambda: sorted(taker.values()) == sorted(sent), 60,
                   "every record, the held ones after their lock")
        counts = {v: n for _, _, n, v in taker.got()}
        assert all(counts[v] == 2 for v in held), counts
        assert all(counts[v] == 1 for v in sent if v not in held), counts
        assert len(taker.values()) == len(sent)
    finally:
        holder.kill()
        taker.kill()


def _held_records_released_by(appliance_factory, fault, released_by: str, logged: str) -> None:
    """A holder takes its batch and never acknowledges; ``fault(appliance, holder)``; then a
    taker gets every record, the held ones with delivery count 2, within 30 s, while the locks
    and the member session timeout are 60 s: only ``fault``'s release (its log line ``logged``)
    explains that."""
    a = appliance_factory(groups={**CONFIG["groups"], "share_record_lock_duration_ms": 60000,
                                  "share_session_timeout_ms": 60000})
    b = a.bootstrap
    topic, group = uid("share"), uid("sg")
    driver("confluent").create_topics(b, {topic: (1, {})})
    sent = produce(b, topic, 0, 20)
    holder = ShareMember("hold", b, group, topic)
    taker = None
    try:
        wait_until(lambda: holder.values(), 60, "the holder's batch")
        held = holder.values()
        fault(a, holder)
        taker = ShareMember("accept", b, group, topic)
        wait_until(lambda: sorted(taker.values()) == sorted(sent), 30,
                   f"every record, the held ones released by {released_by}")
        counts = {v: n for _, _, n, v in taker.got()}
        assert all(counts[v] == 2 for v in held), counts
        assert logged in a.log_text()
    finally:
        holder.kill()
        if taker is not None:
            taker.kill()


def test_a_killed_members_records_are_released_when_its_connection_closes_not_at_the_lock(
        appliance_factory):
    # Kafka releases a share session's records when the connection that opened it closes
    # (ShareSessionCache's ConnectionDisconnectListener -> onMemberLeave); before, a consumer
    # killed -9 held its records until their lock or its member session timed out.
    _held_records_released_by(appliance_factory, lambda a, holder: holder.kill(),
                              "the holder's closed connection",
                              "connection closed; its share session is closed")


def _kill_every_frontend(a, holder) -> None:
    old = {w["pid"] for w in a.workers("frontend")}
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    a.wait_for(lambda: not old & {w["pid"] for w in a.workers("frontend")}
               and a.all_workers_ready(), 60, "new frontends")


def test_records_held_through_a_killed_frontend_are_released_when_it_restarts(appliance_factory):
    # A frontend killed -9 cannot say that its connections closed; its restarted process tells
    # the coordinator, which closes the share sessions of the old process's connections (as a
    # Kafka broker's crash loses its share sessions and acquisitions). Before, the holder's
    # records waited for their 60 s lock.
    _held_records_released_by(appliance_factory, _kill_every_frontend,
                              "the restarted frontend",
                              "frontend restarted; its share session is closed")


def test_share_state_survives_kill9_of_the_coordinator(appliance_factory):
    a = appliance_factory(**CONFIG)
    b = a.bootstrap
    topic, group = uid("share"), uid("sg")
    driver("confluent").create_topics(b, {topic: (1, {})})
    accepted = produce(b, topic, 0, 30)
    first = ShareMember("accept", b, group, topic)
    wait_until(lambda: sorted(first.values()) == sorted(accepted), 60, "the first 30 accepted")
    first.kill()
    unacked = produce(b, topic, 30, 10)
    holder = ShareMember("hold", b, group, topic)
    wait_until(lambda: sorted(holder.values()) == sorted(unacked), 60, "the next 10 acquired")
    (co,) = a.workers("coordinator")
    os.kill(co["pid"], signal.SIGKILL)
    a.wait_for(lambda: [w for w in a.workers("coordinator") if w["pid"] != co["pid"]]
               and a.all_workers_ready(), 60, "a new coordinator")
    holder.kill()
    later = produce(b, topic, 40, 5)
    taker = ShareMember("accept", b, group, topic)
    try:
        wait_until(lambda: sorted(taker.values()) == sorted(unacked + later), 60,
                   "the unacknowledged and the new records")
        assert not set(taker.values()) & set(accepted), "an accepted record came back"
        assert len(taker.values()) == len(unacked + later)
    finally:
        taker.kill()


def test_java_share_consumer_explicit_acknowledgement_and_admin(appliance_factory, java4_program):
    """kafka-clients 4.3.0's KafkaShareConsumer in explicit mode: RELEASE of a record brings it
    back (delivery count 2), ACCEPT and commitSync make the rest done: a second run of the same
    group gets only the record produced after the first. Then 4.3's Admin: listGroups for share
    groups, describeShareGroups, listShareGroupOffsets (v1, with lag), alterShareGroupOffsets,
    deleteShareGroupOffsets, deleteShareGroups."""
    a = appliance_factory(**CONFIG)
    b = a.bootstrap
    topic, group = uid("sharej"), uid("sgj")
    driver("confluent").create_topics(b, {topic: (1, {})})
    sent = produce(b, topic, 0, 100)
    out = java4_program("ShareConsumerExplicit", b, group, topic, str(len(sent)), "60")
    released = sum(1 for v in sent if v.endswith("7"))
    assert (out["read"], out["duplicates"], out["redelivered"]) == ("100", "0", str(released)), out
    (later,) = produce(b, topic, 100, 1)
    out = java4_program("ShareConsumerExplicit", b, group, topic, "1", "60")
    assert (out["read"], out["values"]) == ("1", later), out
    # kafka-clients 4.3's Admin on the group its consumer left (tests/java/ShareAdmin4.java):
    # listed Empty, start offset 101 and lag 0; reset to 5 (lag 96); offsets and group deleted.
    out = java4_program("ShareAdmin4", b, group, topic, "5")
    assert f"{group}:Share:Empty" in out["listed"].split(","), out
    assert (out["state"], out["offsets"]) == ("Empty", "0:101:0"), out
    assert (out["altered"], out["reset"]) == ("ok", "0:5:96"), out
    assert (out["deleted"], out.get("after", "")) == ("ok", ""), out
    assert out["gone"] == "ok", out
    assert group not in out.get("finally", ""), out


def test_share_version_feature_and_find_coordinator_share_keys(appliance):
    """ApiVersions finalizes share.version=1 (clients use share groups only then); FindCoordinator
    v6 key type 2 (share) answers this node for a ``group:topicId:partition`` key and
    INVALID_REQUEST for a malformed one."""
    with RawClient(appliance.bootstrap) as c:
        r = c.request(18, 4, {"client_software_name": "t", "client_software_version": "1"})
        assert {f.name: f.max_version_level for f in r.finalized_features}["share.version"] == 1
        assert {f.name: (f.min_version, f.max_version)
                for f in r.supported_features}["share.version"] == (0, 1)
        good = f"g:{uuid.uuid4()}:0"
        r = c.request(10, 6, {"key_type": 2, "coordinator_keys": [good, "nope"]})
        assert [(k.key, k.error_code, k.node_id >= 0) for k in r.coordinators] == [
            (good, 0, True), ("nope", 42, False)], r


def _assigned(member) -> set[int]:
    return {p for tp in member.assignment.topic_partitions for p in tp.partitions}


def test_two_share_members_on_four_partitions_get_two_each_from_the_simple_assignor(
        appliance_factory):
    """Kafka 4.1+'s ``simple`` share assignor through ShareGroupDescribe: two members of a
    4-partition topic own two partitions each, together all four (not every partition each,
    as before: librdkafka 0172 mixed_ack_mode_same_group); both are served, every record once.
    Which partitions a member reads is its client's doing: a ShareFetch sent before its
    assignment shrank (a long poll parked on all four) may still name partitions it gave up,
    and Kafka does not refuse it either, so deliveries are not held to the assignment."""
    from confluent_kafka import Producer
    a = appliance_factory(**CONFIG)
    b = a.bootstrap
    topic, group = uid("share4"), uid("sg4")
    driver("confluent").create_topics(b, {topic: (4, {})})
    members = [ShareMember("implicit", b, group, topic, 10) for _ in range(2)]
    try:
        def split():
            g = describe(b, group)
            if g.error_code or len(g.members) != 2:
                return None
            owned = [_assigned(m) for m in g.members]
            ok = (all(len(o) == 2 for o in owned) and owned[0] | owned[1] == {0, 1, 2, 3})
            return (g, owned) if ok else None
        wait_until(split, 60, "two members owning two partitions each")
        g, owned = split()
        assert (g.group_state, g.assignor_name) == ("Stable", "simple"), g
        p = Producer({"bootstrap.servers": b, "linger.ms": 5})
        sent = []
        for i in range(200):
            v = f"r{i}"
            p.produce(topic, value=v.encode(), partition=i % 4)
            sent.append(v)
        assert p.flush(30) == 0
        wait_until(lambda: sorted(v for m in members for v in m.values()) == sorted(sent), 60,
                   "every record delivered")
        got = [v for m in members for v in m.values()]
        assert len(got) == len(set(got)) == 200, "a record was delivered twice"
        assert all(m.values() for m in members), [len(m.values()) for m in members]
    finally:
        for m in members:
            m.kill()


def test_a_groups_lock_duration_is_held_to_the_brokers_bounds(appliance_factory):
    """``share.record.lock.duration.ms`` on a GROUP resource (IncrementalAlterConfigs) must lie
    within ``[groups] share_min/max_record_lock_duration_ms`` (Kafka's
    group.share.min/max.record.lock.duration.ms): here lowered to 1 s, as librdkafka's test
    clusters do, so the 3 s its tests set is taken, 999 ms and 60,001 ms are INVALID_CONFIG, and
    DescribeConfigs shows what was taken."""
    a = appliance_factory(groups={"share_min_record_lock_duration_ms": 1000,
                                  "share_max_record_lock_duration_ms": 60000})
    group = uid("sglock")

    def alter(c, value):
        r = c.request(44, 1, {"resources": [{"resource_type": 32, "resource_name": group,
                                             "configs": [{"name": "share.record.lock.duration.ms",
                                                          "config_operation": 0,
                                                          "value": value}]}],
                              "validate_only": False})
        (x,) = r.responses
        return x.error_code, x.error_message or ""

    with RawClient(a.bootstrap) as c:
        code, msg = alter(c, "999")
        assert code == 40 and "share.record.lock.duration.ms" in msg, (code, msg)
        assert alter(c, "60001")[0] == 40
        assert alter(c, "3000") == (0, "")
        r = c.request(32, 4, {"resources": [{"resource_type": 32, "resource_name": group,
                                             "configuration_keys": ["share.record.lock.duration.ms"]}],
                              "include_synonyms": False, "include_documentation": False})
        (res,) = r.results
        assert [(e.name, e.value) for e in res.configs] == [("share.record.lock.duration.ms", "3000")], res


def _raw_share_member(c, topic: str, group: str) -> tuple[str, object]:
    """A new member of ``group`` over ``c`` (raw ShareGroupHeartbeat until it is assigned
    partition 0 of ``topic``): its member id and the topic's id."""
    member = uuid.uuid4().hex[:22]
    state = {"epoch": 0}

    def assigned():
        hb = c.request(76, 1, {"group_id": group, "member_id": member,
                               "member_epoch": state["epoch"],
                               "subscribed_topic_names": [topic] if state["epoch"] == 0 else None})
        assert hb.error_code == 0, hb
        state["epoch"] = hb.member_epoch
        a = hb.assignment
        return a is not None and any(list(tp.partitions) == [0] for tp in a.topic_partitions)
    wait_until(assigned, 30, "the member assigned the partition")
    md = c.request(3, 12, {"topics": [{"name": topic, "topic_id": None}],
                           "allow_auto_topic_creation": False,
                           "include_topic_authorized_operations": False})
    return member, md.topics[0].topic_id


def _first_acquisition(c, topic: str, group: str, max_records: int):
    """A new member of ``group`` (``_raw_share_member``) and the acquired ranges of its
    ShareFetches until one acquires something."""
    member, tid = _raw_share_member(c, topic, group)

    def fetch():
        f = c.request(78, 1, {"group_id": group, "member_id": member,
                              "share_session_epoch": fetch.epoch, "max_wait": 100,
                              "min_bytes": 1, "max_bytes": 1 << 20, "max_records": max_records,
                              "batch_size": max_records, "forgotten_topics_data": [],
                              "topics": [{"topic_id": tid, "partitions": [
                                  {"partition_index": 0, "acknowledgement_batches": []}]}]})
        assert f.error_code == 0, f
        fetch.epoch += 1
        got = [(a.first_offset, a.last_offset) for t in f.responses for p in t.partitions
               for a in p.acquired_records]
        return got or None
    fetch.epoch = 0
    return wait_until(fetch, 30, "records acquired")


def test_a_groups_share_partition_max_record_locks_is_its_in_flight_window(appliance):
    """KIP-1240 (Kafka 4.3): ``share.partition.max.record.locks`` on a GROUP resource is that
    group's in-flight window per share partition: with 100, a ShareFetch of max_records 500
    acquires offsets 0-99 of 300 records (in batches of 10); a group without it takes all 300
    (the broker's 2,000)."""
    from confluent_kafka import Producer
    b = appliance.bootstrap
    topic, small, other = uid("window"), uid("sgwin"), uid("sgwin")
    driver("confluent").create_topics(b, {topic: (1, {})})
    p = Producer({"bootstrap.servers": b, "linger.ms": 0})
    for i in range(300):
        p.produce(topic, value=f"w{i}".encode(), partition=0)
        if i % 10 == 9:
            assert p.flush(30) == 0
    with RawClient(b) as c:
        for group, configs in ((small, [("share.partition.max.record.locks", "100")]), (other, [])):
            r = c.request(44, 1, {"resources": [{"resource_type": 32, "resource_name": group,
                                                 "configs": [{"name": n, "config_operation": 0,
                                                              "value": v} for n, v in
                                                             [("share.auto.offset.reset",
                                                               "earliest")] + configs]}],
                                  "validate_only": False})
            assert [x.error_code for x in r.responses] == [0], r
        r = c.request(44, 1, {"resources": [{"resource_type": 32, "resource_name": small,
                                             "configs": [{"name": "share.partition.max.record.locks",
                                                          "config_operation": 0, "value": "99"}]}],
                              "validate_only": False})
        assert [x.error_code for x in r.responses] == [40], r          # INVALID_CONFIG
        r = c.request(32, 4, {"resources": [{"resource_type": 32, "resource_name": small,
                                             "configuration_keys": ["share.partition.max.record.locks"]}],
                              "include_synonyms": False, "include_documentation": False})
        (res,) = r.results
        assert [(e.name, e.value) for e in res.configs] == [
            ("share.partition.max.record.locks", "100")], res
        assert _first_acquisition(c, topic, small, 500) == [(0, 99)]
        assert _first_acquisition(c, topic, other, 500) == [(0, 299)]


def test_a_share_fetch_of_max_bytes_zero_acquires_and_returns_nothing(appliance):
    """librdkafka 0180 fetch_max_bytes_zero: a ShareFetch with MaxBytes 0 answers no records
    (as against Kafka and the Java client) and acquires none: the next ShareFetch of the
    session gets them all from the start offset, delivered for the first time."""
    b = appliance.bootstrap
    topic, group = uid("zero"), uid("sgzero")
    driver("confluent").create_topics(b, {topic: (1, {})})
    with RawClient(b) as c:
        r = c.request(44, 1, {"resources": [{"resource_type": 32, "resource_name": group,
                                             "configs": [{"name": "share.auto.offset.reset",
                                                          "config_operation": 0,
                                                          "value": "earliest"}]}],
                              "validate_only": False})
        assert [x.error_code for x in r.responses] == [0], r
    produce(b, topic, 0, 5)
    with RawClient(b) as c:
        member, tid = _raw_share_member(c, topic, group)

        def fetch(epoch, max_bytes):
            f = c.request(78, 1, {"group_id": group, "member_id": member,
                                  "share_session_epoch": epoch, "max_wait": 100, "min_bytes": 1,
                                  "max_bytes": max_bytes, "max_records": 10, "batch_size": 10,
                                  "forgotten_topics_data": [],
                                  "topics": [{"topic_id": tid, "partitions": [
                                      {"partition_index": 0, "acknowledgement_batches": []}]}]})
            assert f.error_code == 0, f
            ((part,),) = [t.partitions for t in f.responses] or [(None,)]
            return part
        part = fetch(0, 0)
        assert part is None or (part.error_code, list(part.acquired_records),
                                bool(part.records)) == (0, [], False), part

        def got():
            p = fetch(got.epoch, 1 << 20)
            got.epoch += 1
            return p is not None and p.acquired_records and p
        got.epoch = 1
        part = wait_until(got, 30, "the records acquired by a fetch with room")
        assert [(a.first_offset, a.delivery_count) for a in part.acquired_records][0] == (0, 1), part


def test_java_share_consumer_renews_its_locks_past_the_lock_duration(appliance_factory,
                                                                     java4_program):
    """KIP-1222 with kafka-clients 4.3.0: a KafkaShareConsumer holds three records for 8 s under
    2 s locks, acknowledging them RENEW (ShareAcknowledge / ShareFetch v2 with is_renew_ack)
    every 500 ms while it keeps polling: no lock lapses (a lapsed one would deliver the record
    again, to it, with delivery count 2), every renewal is answered without error, and the
    ACCEPT at the end is taken (after a lapse it would be INVALID_RECORD_STATE): the share
    partition's start offset moves past the three."""
    a = appliance_factory(groups={**CONFIG["groups"], "share_record_lock_duration_ms": 2000,
                                  "share_min_record_lock_duration_ms": 1000})
    b = a.bootstrap
    topic, group = uid("renew"), uid("sgrenew")
    driver("confluent").create_topics(b, {topic: (1, {})})
    sent = produce(b, topic, 0, 3)
    out = java4_program("ShareConsumerRenew", b, group, topic, "3", "8", "500")
    assert out["held"] == ",".join(sorted(sent)), out
    assert int(out["renewals"]) >= 8 and out["renew_errors"] == "0", out
    assert out.get("again", "") == "" and out["accepted"] == "3", out
    assert "accept_error" not in out, out
    with RawClient(b) as c:
        r = c.request(90, 1, {"groups": [{"group_id": group, "topics": [
            {"topic_name": topic, "partitions": [0]}]}]})
    ((p,),) = [t.partitions for t in r.groups[0].topics]
    assert (p.error_code, p.start_offset) == (0, 3), r
