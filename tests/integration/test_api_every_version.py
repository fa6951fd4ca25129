"""Every API the appliance advertises, at every version it advertises, gets a well-formed answer.

Catches handlers that build a field or nested entity that exists only in some versions: each
request here is encoded by kio for exactly that version and the answer decoded the same way.
"""

import uuid

import pytest

from appliance.protocol.records import Record, build_batch
from rawclient import RawClient


def _ranges(raw: RawClient) -> dict[int, tuple[int, int]]:
    resp = raw.request(18, 3, {"client_software_name": "test", "client_software_version": "1.0"})
    assert resp.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


def test_every_version_of_every_api(appliance):
    with RawClient(appliance.bootstrap) as raw:
        ranges = _ranges(raw)
        assert {0, 1, 2, 3, 10, 18, 19, 20, 22, 32, 60, 61} <= ranges.keys()
        topic_ids = {}
        # CreateTopics first: one topic per version, used by the APIs below.
        lo, hi = ranges[19]
        for v in range(lo, hi + 1):
            name = f"every-{v}"
            r = raw.request(19, v, {"topics": [{"name": name, "num_partitions": 2, "replication_factor": 1,
                                                "assignments": [], "configs": []}],
                                    "timeout_ms": 30000, "validate_only": False})
            assert r.topics[0].error_code == 0, (v, r)
        md = raw.request(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                 "include_topic_authorized_operations": False})
        topic_ids = {t.name: t.topic_id for t in md.topics}
        assert "every-2" in topic_ids and topic_ids["every-2"] != uuid.UUID(int=0)
        topic = "every-2"
        batch = build_batch([Record(key=b"k", value=b"v")])
        for key, (lo, hi) in sorted(ranges.items()):
            for v in range(lo, hi + 1):
                if key == 19:
                    continue
                req = _request_for(key, v, topic, topic_ids[topic], batch)
                resp = raw.request(key, v, req)
                _check(key, v, resp)


def _request_for(key, v, topic, topic_id, batch):
    if key == 0:
        return {"transactional_id": None, "acks": -1, "timeout_ms": 10000,
                "topic_data": [{"name": topic, "topic_id": topic_id,
                                "partition_data": [{"index": 0, "records": batch}]}]}
    if key == 1:
        return {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": topic, "topic_id": topic_id,
                            "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}],
                "forgotten_topics_data": [], "rack_id": ""}
    if key == 2:
        return {"replica_id": -1, "isolation_level": 0,
                "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]}
    if key == 3:
        return {"topics": [{"name": topic, "topic_id": None}], "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": True}
    if key == 10:
        return {"key": "g", "key_type": 0, "coordinator_keys": ["g"]}
    if key == 18:
        return {"client_software_name": "test", "client_software_version": "1.0"}
    if key == 20:
        return {"topic_names": [f"every-missing-{v}"], "topics": [{"name": f"every-missing-{v}"}],
                "timeout_ms": 10000}
    if key == 22:
        return {"transactional_id": None, "transaction_timeout_ms": 60000, "producer_id": -1,
                "producer_epoch": -1}
    if key == 61:
        return {"topics": [{"name": topic, "partition_indexes": [0, 1]}]}
    if key == 32:
        return {"resources": [{"resource_type": 2, "resource_name": topic, "configuration_keys": None},
                              {"resource_type": 4, "resource_name": "1", "configuration_keys": None}],
                "include_synonyms": True, "include_documentation": True}
    if key == 60:
        return {"include_cluster_authorized_operations": False}
    raise AssertionError(f"no request written for api key {key}: add one")


def _check(key, v, resp):
    if key == 0:
        p = resp.responses[0].partition_responses[0]
        assert p.error_code == 0 and p.base_offset >= 0, (v, resp)
    elif key == 1:
        p = resp.responses[0].partitions[0]
        assert p.error_code == 0 and p.high_watermark >= 1 and p.records, (v, resp)
    elif key == 2:
        p = resp.topics[0].partitions[0]
        assert p.error_code == 0 and p.offset >= 1, (v, resp)
    elif key == 3:
        assert resp.topics[0].error_code == 0 and len(resp.topics[0].partitions) == 2, (v, resp)
    elif key == 10:
        err = resp.coordinators[0].error_code if v >= 4 else resp.error_code
        assert err == 0, (v, resp)
    elif key == 18:
        assert resp.error_code == 0 and resp.api_keys, (v, resp)
    elif key == 20:
        r = resp.responses[0]
        assert r.error_code == 3, (v, resp)          # UNKNOWN_TOPIC_OR_PARTITION
    elif key == 32:
        assert [r.error_code for r in resp.results] == [0, 0], (v, resp)
        assert any(c.name == "retention.ms" for c in resp.results[0].configs)
    elif key == 22:
        assert resp.error_code == 0 and resp.producer_id >= 0 and resp.producer_epoch == 0, (v, resp)
    elif key == 61:
        assert [p.error_code for p in resp.topics[0].partitions] == [0, 0], (v, resp)
    elif key == 60:
        assert resp.error_code == 0 and resp.brokers[0].port > 0, (v, resp)
