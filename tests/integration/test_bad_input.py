"""Bad input gets Kafka's error code, or a closed connection where Kafka closes it; no worker dies.

One appliance serves the whole module; at the end every worker must still be the one that
started (same pids) and produce/fetch must still work.
"""

import os
import socket
import struct

import crc32c
import pytest

from appliance.protocol.records import Record, build_batch
from appliance_harness import Appliance
from raw_wire import RawClient

MAX_FRAME = 256 * 1024


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad-input")
    a = Appliance(data_dir=str(d / "data"), log_path=str(d / "appliance.log"),
                  config={"server": {"socket_request_max_bytes": MAX_FRAME},
                          "log": {"message_max_bytes": 64 * 1024}})
    a.start()
    with RawClient(a.bootstrap) as raw:
        r = raw.request(19, 7, {"topics": [{"name": "bad", "num_partitions": 2, "replication_factor": 1,
                                            "assignments": [], "configs": []}], "timeout_ms": 10000})
        assert r.topics[0].error_code == 0
    a.pids_at_start = {w["name"]: w["pid"] for w in a.workers()}
    yield a
    a.terminate()


def produce(raw, partitions: dict[int, bytes], acks=-1, version=9, topic="bad"):
    r = raw.request(0, version, {"transactional_id": None, "acks": acks, "timeout_ms": 10000,
                                 "topic_data": [{"name": topic, "partition_data": [
                                     {"index": p, "records": b} for p, b in partitions.items()]}]},
                    expect_response=acks != 0)
    if r is None:
        return None
    return {p.index: p for p in r.responses[0].partition_responses}


def good_batch(n=3) -> bytes:
    return build_batch([Record(key=b"k%d" % i, value=b"v" * 10) for i in range(n)])


def with_fixed_crc(b: bytearray) -> bytes:
    struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[21:])))
    return bytes(b)


def test_oversized_frame_closes_connection(app):
    with RawClient(app.bootstrap) as raw:
        raw.send_bytes(struct.pack(">i", MAX_FRAME + 1) + b"\x00" * 64)
        assert raw.closed_by_peer()


def test_negative_frame_size_closes_connection(app):
    with RawClient(app.bootstrap) as raw:
        raw.send_bytes(struct.pack(">i", -5))
        assert raw.closed_by_peer()


def test_truncated_frame_then_hangup_is_harmless(app):
    with RawClient(app.bootstrap) as raw:
        raw.send_bytes(struct.pack(">i", 100) + b"\x00\x12\x00\x00")
    # the next connection is served normally
    with RawClient(app.bootstrap) as raw:
        assert raw.request(18, 0, {}).error_code == 0


def test_unknown_api_key_closes_connection(app):
    with RawClient(app.bootstrap) as raw:
        raw.send_frame(struct.pack(">hhih", 9999, 0, 1, -1))
        assert raw.closed_by_peer()


def test_unsupported_produce_version_closes_connection(app):
    with RawClient(app.bootstrap) as raw:
        raw.send_frame(struct.pack(">hhih", 0, 2, 1, -1) + b"\x00" * 20)
        assert raw.closed_by_peer()


def test_unknown_api_versions_version_gets_error_35_in_v0_layout(app):
    with RawClient(app.bootstrap) as raw:
        raw.send_frame(struct.pack(">hhih", 18, 99, 5, -1) + b"\x00\x00")
        frame = raw.recv_frame()
        corr, err, n = struct.unpack_from(">ihi", frame, 0)
        assert corr == 5 and err == 35 and n == 1
        key, lo, hi = struct.unpack_from(">hhh", frame, 10)
        assert (key, lo, hi) == (18, 0, 4)


def test_garbage_body_closes_connection(app):
    with RawClient(app.bootstrap) as raw:
        raw.send_frame(struct.pack(">hhih", 3, 12, 1, -1) + b"\x00" + b"\xff" * 7)
        assert raw.closed_by_peer()


def test_bad_crc_is_corrupt_message_and_other_partition_unaffected(app):
    b = bytearray(good_batch())
    b[-1] ^= 0xFF
    with RawClient(app.bootstrap) as raw:
        res = produce(raw, {0: bytes(b), 1: good_batch()})
    assert res[0].error_code == 2          # CORRUPT_MESSAGE
    assert res[1].error_code == 0 and res[1].base_offset >= 0


def test_wrong_magic_is_rejected(app):
    b = bytearray(good_batch())
    b[16] = 1
    with RawClient(app.bootstrap) as raw:
        assert produce(raw, {0: bytes(b)})[0].error_code == 87      # INVALID_RECORD (v3+ needs magic 2)
    b[16] = 7
    with RawClient(app.bootstrap) as raw:
        assert produce(raw, {0: bytes(b)})[0].error_code == 2       # CORRUPT_MESSAGE


def test_record_count_disagreeing_with_last_offset_delta(app):
    b = bytearray(good_batch(3))
    struct.pack_into(">i", b, 57, 5)       # records count field
    with RawClient(app.bootstrap) as raw:
        assert produce(raw, {0: with_fixed_crc(b)})[0].error_code == 87


def test_batch_over_max_message_bytes(app):
    big = build_batch([Record(key=None, value=os.urandom(70 * 1024))])
    with RawClient(app.bootstrap) as raw:
        assert produce(raw, {0: big})[0].error_code == 10          # MESSAGE_TOO_LARGE


def test_control_batch_from_client_is_invalid_record(app):
    b = bytearray(good_batch())
    attrs = struct.unpack_from(">h", b, 21)[0] | 0x20
    struct.pack_into(">h", b, 21, attrs)
    with RawClient(app.bootstrap) as raw:
        assert produce(raw, {0: with_fixed_crc(b)})[0].error_code == 87


def test_two_batches_in_one_partition_is_invalid_record(app):
    with RawClient(app.bootstrap) as raw:
        assert produce(raw, {0: good_batch() + good_batch()})[0].error_code == 87


def test_invalid_acks(app):
    with RawClient(app.bootstrap) as raw:
        assert produce(raw, {0: good_batch()}, acks=2)[0].error_code == 21   # INVALID_REQUIRED_ACKS


def test_unknown_topic_and_partition(app):
    with RawClient(app.bootstrap) as raw:
        assert produce(raw, {7: good_batch()})[7].error_code == 3
        assert produce(raw, {0: good_batch()}, topic="nope")[0].error_code == 3


def test_acks0_with_error_closes_connection(app):
    b = bytearray(good_batch())
    b[-1] ^= 0xFF
    with RawClient(app.bootstrap) as raw:
        produce(raw, {0: bytes(b)}, acks=0)
        assert raw.closed_by_peer()


def test_acks0_success_sends_no_response_and_keeps_order(app):
    with RawClient(app.bootstrap) as raw:
        produce(raw, {0: good_batch()}, acks=0)
        # the next request's answer is the first thing on the wire
        assert raw.request(18, 0, {}).error_code == 0


def test_zstd_before_produce_v7_is_refused(app):
    z = build_batch([Record(key=b"k", value=b"v" * 100)], compression=4)
    with RawClient(app.bootstrap) as raw:
        assert produce(raw, {0: z}, version=6)[0].error_code == 76   # UNSUPPORTED_COMPRESSION_TYPE
        assert produce(raw, {0: z}, version=7)[0].error_code == 0


def test_fetch_out_of_range_offset(app):
    with RawClient(app.bootstrap) as raw:
        r = raw.request(1, 11, {"max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                                "topics": [{"topic": "bad", "partitions": [
                                    {"partition": 1, "fetch_offset": 10**9, "partition_max_bytes": 1 << 20}]}],
                                "forgotten_topics_data": [], "rack_id": ""})
        p = r.responses[0].partitions[0]
        assert p.error_code == 1 and p.high_watermark >= 0              # OFFSET_OUT_OF_RANGE


def test_fetch_unknown_session_is_refused(app):
    with RawClient(app.bootstrap) as raw:
        r = raw.request(1, 11, {"max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                "isolation_level": 0, "session_id": 1234, "session_epoch": 3,
                                "topics": [], "forgotten_topics_data": [], "rack_id": ""})
        assert r.error_code == 70                                      # FETCH_SESSION_ID_NOT_FOUND


def test_many_connections_dropped_mid_request(app):
    for _ in range(50):
        s = socket.create_connection(("127.0.0.1", app.port))
        s.sendall(struct.pack(">i", 1000) + os.urandom(300))
        s.close()
    with RawClient(app.bootstrap) as raw:
        assert raw.request(18, 0, {}).error_code == 0


def test_zz_no_worker_died_and_service_continues(app):
    """Runs last in this module (name order): every worker is the one that started."""
    now = {w["name"]: w["pid"] for w in app.workers()}
    assert {k: v for k, v in now.items() if k in app.pids_at_start} == app.pids_at_start
    with RawClient(app.bootstrap) as raw:
        res = produce(raw, {0: good_batch()})
        assert res[0].error_code == 0
    assert "Traceback" not in app.log_text()


def test_request_followed_by_garbage_in_one_write_is_answered_then_closed(app):
    """Kafka reads a connection's next request only after answering the previous one, so requests
    before a bad frame are answered and then the connection is closed (regression: the answers
    of earlier requests were dropped when garbage followed them in the same read)."""
    with RawClient(app.bootstrap) as raw:
        api_versions = raw.header(18, 3, 1) + raw.encode(18, 3, {"client_software_name": "t",
                                                                 "client_software_version": "1"})
        metadata = raw.header(3, 12, 2) + raw.encode(3, 12, {
            "topics": [{"topic_id": b"\0" * 16, "name": "bad"}], "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False})
        garbage = struct.pack(">hhih", 3, 12, 3, -1) + b"\x00" + b"\xff" * 7
        raw.send_bytes(b"".join(struct.pack(">i", len(f)) + f
                                for f in (api_versions, metadata, garbage)))
        assert raw.read_response(18, 3, 1).error_code == 0
        md = raw.read_response(3, 12, 2)
        assert [t.name for t in md.topics] == ["bad"] and md.topics[0].error_code == 0
        assert raw.closed_by_peer()


def test_failed_acks0_produce_after_a_request_answers_it_then_closes(app):
    """acks=0 with an error closes the connection (the producer's only signal), after the answer
    to the request before it."""
    bad = bytearray(good_batch())
    bad[-1] ^= 0xFF
    with RawClient(app.bootstrap) as raw:
        raw.correlation = 1
        raw.send_frame(raw.header(18, 0, 1) + raw.encode(18, 0, {}))
        raw.request(0, 9, {"transactional_id": None, "acks": 0, "timeout_ms": 1000,
                           "topic_data": [{"name": "bad", "partition_data": [
                               {"index": 0, "records": bytes(bad)}]}]}, expect_response=False)
        assert raw.read_response(18, 0, 1).error_code == 0
        assert raw.closed_by_peer()
