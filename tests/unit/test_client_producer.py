"""appliance.client.Producer: the send loop's answers to each kind of Produce error, and its
requests in flight, against a scripted broker (no sockets: responses are kio entities built by
the codec; a request sent without waiting is answered when the producer reads its answer)."""

from __future__ import annotations

from collections import deque

import pytest

from appliance.client import KafkaError, Producer, TransactionAbortableError
from appliance.client.errors import KafkaConnectionError
from appliance.protocol import messages
from appliance.protocol.records import read_header
from scripted_connection import ScriptedConnection

PRODUCE, INIT, END = 0, 22, 26
VERSIONS = {0: 12, 22: 6, 24: 3, 26: 5, 25: 4, 28: 5}


class ScriptedBroker(ScriptedConnection):
    """One node, one partition per topic; Produce answers come from a script of error codes
    (or exceptions), the rest from small handlers."""

    def __init__(self, tv: int = 2) -> None:
        super().__init__(VERSIONS if tv == 2 else {**VERSIONS, 0: 11, 26: 4, 28: 4}, tv)
        self.produce_script: deque = deque()
        self.produced: list[bytes] = []           # batch bytes of every Produce attempt
        self.sent: list[tuple[int, dict]] = []
        self.next_offset = 0
        self.pid, self.epoch = 1000, 0
        self.invalidated: list[str] = []
        self.unanswered: deque = deque()          # (callback, answer) of requests sent ahead
        self.most_in_flight = 0
        self.conns = {1: self}

    # the pipelined surface: answers are made when the request is sent, and read only when the
    # producer waits for one (nothing has "arrived" for a look without waiting)
    def send(self, api_key: int, body, callback, *, version: int | None = None,
             expect_response: bool = True) -> None:
        try:
            answer = self._answer(api_key, body, version)
        except KafkaConnectionError as exc:
            # The connection is lost: this answer and every one still unread with it.
            answer = exc
            self.unanswered = deque((cb, exc) for cb, _ in self.unanswered)
        if expect_response:
            self.unanswered.append((callback, answer))
            self.most_in_flight = max(self.most_in_flight, len(self.unanswered))

    @property
    def in_flight(self) -> int:
        return len(self.unanswered)

    def complete_one(self, timeout: float | None = None) -> bool:
        if not self.unanswered or timeout is not None:
            return False
        callback, answer = self.unanswered.popleft()
        callback(answer)
        return True

    def complete_all(self) -> None:
        while self.complete_one():
            pass

    # the rest of the BrokerConnection surface the producer uses
    def request(self, api_key: int, body, *, version: int | None = None, expect_response: bool = True):
        self.complete_all()                         # as BrokerConnection.request does
        return self._answer(api_key, body, version)

    def _answer(self, api_key: int, body, version: int | None):
        v = self.versions[api_key] if version is None else version
        self.sent.append((api_key, dict(body)))
        if api_key == PRODUCE:
            values = self._produce(body)
        elif api_key == INIT:
            if body.get("producer_id", -1) >= 0:
                self.pid += 1                       # a bump hands out a new id (idempotent)
            values = {"error_code": 0, "producer_id": self.pid, "producer_epoch": self.epoch,
                      "ongoing_txn_producer_id": -1, "ongoing_txn_producer_epoch": -1}
        elif api_key == END:
            self.epoch += 1 if v >= 5 else 0
            values = {"error_code": 0, "producer_id": self.pid, "producer_epoch": self.epoch}
        elif api_key == 24:
            values = {"results_by_topic_v3_and_below": [
                {"name": t["name"], "results_by_partition": [
                    {"partition_index": p, "partition_error_code": 0} for p in t["partitions"]]}
                for t in body["v3_and_below_topics"]]}
        else:
            raise AssertionError(f"unexpected api {api_key}")
        return messages.build(messages.response_class(api_key, v), values)

    def _produce(self, body) -> dict:
        (topic,) = body["topic_data"]
        (part,) = topic["partition_data"]
        self.produced.append(part["records"])
        step = self.produce_script.popleft() if self.produce_script else 0
        if isinstance(step, Exception):
            raise step
        code, offset = step, -1
        if code == 0:
            offset = self.next_offset
            self.next_offset += read_header(part["records"]).records_count
        return {"responses": [{"name": topic["name"], "partition_responses": [
            {"index": part["index"], "error_code": code, "base_offset": offset,
             "log_append_time_ms": -1, "log_start_offset": 0}]}]}

    # the Cluster surface
    def partitions_for(self, topic: str) -> int:
        return 1

    def leader(self, topic: str, partition: int) -> int:
        return 1

    def connection(self, node: int):
        return self

    def any_connection(self):
        return self

    def coordinator(self, key, key_type, *, timeout_ms=None):
        return self

    def invalidate(self, topic: str) -> None:
        self.invalidated.append(topic)

    def forget_coordinator(self, key, key_type) -> None:
        pass

    def close(self) -> None:
        pass


def producer(broker: ScriptedBroker, **config) -> Producer:
    p = Producer(bootstrap_servers="unused:1", retry_backoff_ms=1, linger_ms=60000, **config)
    p.cluster = p.txn.cluster = broker            # nothing was connected yet
    return p


def codes(broker: ScriptedBroker, api_key: int) -> list[dict]:
    return [body for key, body in broker.sent if key == api_key]


def test_a_lost_answer_is_retried_with_the_same_bytes():
    broker = ScriptedBroker()
    broker.produce_script.extend([KafkaConnectionError("reset"), 6, 0])   # lost, NOT_LEADER, ok
    p = producer(broker)
    ds = [p.send("t", b"v%d" % i) for i in range(3)]
    p.flush()
    assert len(broker.produced) == 3 and len(set(broker.produced)) == 1
    h = read_header(broker.produced[0])
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (1000, 0, 0)
    assert [d.get().offset for d in ds] == [0, 1, 2]
    assert broker.invalidated == ["t"]                   # NOT_LEADER: metadata looked up again
    p.send("t", b"next")
    p.flush()
    assert read_header(broker.produced[-1]).base_sequence == 3


def test_duplicate_sequence_counts_as_written():
    broker = ScriptedBroker()
    broker.produce_script.append(46)
    p = producer(broker)
    d = p.send("t", b"v")
    p.flush()
    assert d.get().offset == -1


def test_out_of_order_on_an_idempotent_producer_takes_a_new_producer_id():
    broker = ScriptedBroker()
    broker.produce_script.extend([0, 45, 0])
    p = producer(broker)
    p.send("t", b"a")
    p.flush()
    d = p.send("t", b"b")
    p.flush()
    first, refused, resent = (read_header(b) for b in broker.produced)
    assert (refused.producer_id, refused.base_sequence) == (1000, 1)
    assert (resent.producer_id, resent.base_sequence) == (1001, 0)     # KIP-360: from 0 again
    bump = codes(broker, INIT)[-1]
    assert (bump["producer_id"], bump["producer_epoch"]) == (1000, 0)
    assert d.get().offset == 1


def test_a_refused_batch_gives_its_sequences_back():
    broker = ScriptedBroker()
    broker.produce_script.extend([10, 0])                 # MESSAGE_TOO_LARGE, then fine
    p = producer(broker)
    d = p.send("t", b"big")
    with pytest.raises(KafkaError) as e:
        p.flush()
    assert e.value.code == 10
    with pytest.raises(KafkaError):
        d.get()
    p.send("t", b"small")
    p.flush()
    assert read_header(broker.produced[-1]).base_sequence == 0


@pytest.mark.parametrize("tv", [1, 2])
def test_out_of_order_in_a_transaction_makes_it_abortable_then_a_new_epoch(tv):
    broker = ScriptedBroker(tv)
    broker.produce_script.append(45)
    p = producer(broker, transactional_id="tid")
    p.init_transactions()
    assert p.transaction_version == tv
    p.begin_transaction()
    p.send("t", b"x")
    with pytest.raises(TransactionAbortableError):
        p.commit_transaction()
    with pytest.raises(TransactionAbortableError):
        p.send("t", b"y")                                  # only abort is possible now
    p.abort_transaction()
    assert codes(broker, END)[-1]["committed"] is False
    if tv == 1:
        # KIP-360 for version 1: InitProducerId with the current pair bumps the epoch.
        bump = codes(broker, INIT)[-1]
        assert (bump["producer_id"], bump["producer_epoch"]) == (1000, 0)
    assert p.producer_id > 1000 or p.producer_epoch > 0
    p.begin_transaction()
    p.send("t", b"z")
    p.commit_transaction()
    h = read_header(broker.produced[-1])
    assert h.base_sequence == 0 and (h.producer_id, h.producer_epoch) == (p.producer_id, p.producer_epoch - (tv == 2))


def test_transaction_version_1_adds_the_partition_before_producing():
    broker = ScriptedBroker(tv=1)
    p = producer(broker, transactional_id="tid")
    p.init_transactions()
    p.begin_transaction()
    p.send("t", b"x")
    p.commit_transaction()
    order = [key for key, _ in broker.sent]
    assert order.index(24) < order.index(PRODUCE) < order.index(END)
    assert codes(broker, PRODUCE)[0]["transactional_id"] == "tid"


def headers_of(broker: ScriptedBroker) -> list[tuple[int, int, int]]:
    return [(h.producer_id, h.base_sequence, h.records_count)
            for h in (read_header(b) for b in broker.produced)]


def test_an_idempotent_producer_keeps_five_produce_requests_in_flight_in_sequence_order():
    broker = ScriptedBroker()
    p = producer(broker, batch_size=80)                     # one record per batch
    ds = [p.send("t", b"record-%02d" % i) for i in range(12)]
    assert broker.in_flight == 5                            # sent without waiting, then held
    p.flush()
    assert broker.most_in_flight == 5
    assert [seq for _, seq, _ in headers_of(broker)] == list(range(12))
    assert [d.get().offset for d in ds] == list(range(12))


def test_without_idempotence_one_request_is_in_flight():
    broker = ScriptedBroker()
    p = producer(broker, batch_size=80, acks=1, enable_idempotence=False)
    for i in range(6):
        p.send("t", b"record-%02d" % i)
    p.flush()
    assert broker.most_in_flight == 1 and len(broker.produced) == 6


def test_a_batch_refused_in_the_middle_goes_back_with_the_later_ones_in_sequence_order():
    broker = ScriptedBroker()
    # 4 batches in flight: the 2nd answered NOT_LEADER, so the broker refused the 3rd and 4th as
    # out of order; all three are sent again, in order, with the same bytes.
    broker.produce_script.extend([0, 6, 45, 45, 0, 0, 0])
    p = producer(broker, batch_size=80)
    ds = [p.send("t", b"record-%02d" % i) for i in range(4)]
    p.flush()
    sent = broker.produced
    assert len(sent) == 7 and sent[4:] == sent[1:4]
    assert [seq for _, seq, _ in headers_of(broker)] == [0, 1, 2, 3, 1, 2, 3]
    assert [d.get().offset for d in ds] == [0, 1, 2, 3]
    assert len(codes(broker, INIT)) == 1                    # no new producer id for that


def test_a_connection_lost_with_requests_in_flight_sends_them_again_in_order():
    broker = ScriptedBroker()
    # The 1st was written but its answer lost with the connection, the 2nd not written, so the
    # 3rd was refused as out of order; all three again, in order: the 1st is a duplicate.
    broker.produce_script.extend([0, KafkaConnectionError("reset"), 45, 46, 0, 0])
    p = producer(broker, batch_size=80)
    ds = [p.send("t", b"record-%02d" % i) for i in range(3)]
    p.flush()
    assert [seq for _, seq, _ in headers_of(broker)] == [0, 1, 2, 0, 1, 2]
    assert broker.produced[3:] == broker.produced[:3]
    assert [d.get().offset for d in ds] == [-1, 1, 2]
    assert len(codes(broker, INIT)) == 1


def test_an_idempotent_producer_takes_a_new_producer_id_once_nothing_is_in_flight():
    broker = ScriptedBroker()
    broker.produce_script.extend([0, 45, 45, 0, 0])       # the broker lost our state
    p = producer(broker, batch_size=80)
    ds = [p.send("t", b"record-%02d" % i) for i in range(3)]
    p.flush()
    assert headers_of(broker) == [(1000, 0, 1), (1000, 1, 1), (1000, 2, 1), (1001, 0, 1), (1001, 1, 1)]
    assert len(codes(broker, INIT)) == 2
    assert all(d.get() for d in ds)


def test_encoded_records_go_out_as_one_batch_after_what_the_partition_had_buffered():
    from appliance.client.accumulator import EncodedRecords
    from appliance.protocol.records import Record, build_batch, decode_records
    broker = ScriptedBroker()
    p = producer(broker, transactional_id="tid")
    p.init_transactions()
    p.begin_transaction()
    first = p.send("t", b"buffered", partition=0)
    body = build_batch([Record(b"k%d" % i, b"v%d" % i, (), 5) for i in range(3)], base_timestamp=5)[61:]
    d = p.send_encoded("t", 0, EncodedRecords(body, 3, 5, 5))
    p.commit_transaction()
    assert headers_of(broker) == [(1000, 0, 1), (1000, 1, 3)]
    assert [(r.offset, r.key, r.value) for r in decode_records(broker.produced[1])] == \
        [(0, b"k0", b"v0"), (1, b"k1", b"v1"), (2, b"k2", b"v2")]
    assert read_header(broker.produced[1]).is_transactional
    assert (first.get().offset, d.get().offset) == (0, 1)
