"""appliance.client.Producer: the send loop's answers to each kind of Produce error, against a
scripted broker (no sockets: responses are kio entities built by the codec)."""

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

    # the rest of the BrokerConnection surface the producer uses
    def request(self, api_key: int, body, *, version: int | None = None, expect_response: bool = True):
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
