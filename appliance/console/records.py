"""The record browser's reading and showing: one Fetch of a partition from an offset, every batch
decoded (control batches too), each record's transaction fate, and bytes shown as text, JSON or
hex.

Runs in the console worker; owns nothing. The Fetch is a consumer's (replica id -1, the asked
isolation level) on the console's connection to the partition's leader, so what it shows is what
a consumer of that principal would be handed, before the consumer's own filtering:
read_committed stops at the last stable offset and the broker lists the aborted transactions it
overlaps (Kafka's AbortedTransactions); read_uncommitted shows everything up to the high
watermark. Marks: a control record is COMMIT or ABORT (its producer); a transactional record is
``aborted`` (an ABORT marker of its producer follows it in what was read, or the broker listed
its transaction as aborted), ``committed`` (a COMMIT marker follows) or ``open`` (no marker yet
in what was read: at the end of the log, its transaction is still open and pins the LSO).
"""

from __future__ import annotations

import json
import uuid

from appliance.client.errors import KafkaError
from appliance.protocol.records import (CONTROL_ABORT, CONTROL_COMMIT, iter_batch_headers,
                                        iter_records, parse_control_record)

FETCH = 1
# One page of records: a fetch returns at least one whole batch even past this.
MAX_BYTES = 256 << 10
SHOWN_BYTES = 4096          # a value longer than this is cut in the page


def fetch_body(topic: str, partition: int, offset: int, read_committed: bool,
               topic_id: uuid.UUID | None = None) -> dict:
    return {"replica_id": -1, "replica_state": {"replica_id": -1, "replica_epoch": -1},
            "max_wait_ms": 0, "min_bytes": 0, "max_bytes": MAX_BYTES,
            "isolation_level": 1 if read_committed else 0, "session_id": 0, "session_epoch": -1,
            "cluster_id": None, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": topic, "topic_id": topic_id, "partitions": [{
                "partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
                "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": MAX_BYTES}]}]}


def browse_partition(conn, topic: str, partition: int, offset: int, read_committed: bool,
                     limit: int) -> dict:
    version = min(conn.version(FETCH), 12)          # by name: no topic ids needed
    r = conn.request(FETCH, fetch_body(topic, partition, offset, read_committed), version=version)
    if int(getattr(r, "error_code", 0)):
        raise KafkaError(int(r.error_code), "Fetch")
    (t,) = r.responses
    (p,) = t.partitions
    if int(p.error_code):
        raise KafkaError(int(p.error_code), f"Fetch of {topic}-{partition} at {offset}")
    aborted = [(a.producer_id, a.first_offset) for a in (p.aborted_transactions or ())]
    rows = decode_fetched(bytes(p.records or b""), offset, aborted, limit)
    return {"topic": topic, "partition": partition, "offset": offset,
            "read_committed": read_committed, "high_watermark": p.high_watermark,
            "last_stable_offset": p.last_stable_offset, "log_start_offset": p.log_start_offset,
            "aborted": [{"producer_id": pid, "first_offset": first} for pid, first in aborted],
            "records": rows}


def decode_fetched(data: bytes, offset: int, aborted: list[tuple[int, int]],
                   limit: int) -> list[dict]:
    """Rows for the page: every record at or after ``offset`` (at most ``limit``), control
    records included, each with its ``mark``."""
    rows: list[dict] = []
    pending: dict[int, list[dict]] = {}        # producer id -> its transactional rows not yet decided
    listed = sorted(aborted, key=lambda a: a[1])
    mv = memoryview(data)
    for pos, h in iter_batch_headers(mv):
        if pos + h.size > len(mv):
            break                                # a batch cut by the byte limit
        if len(rows) >= limit and not pending:
            break                                # the page is full and every fate is known
        if h.last_offset < offset:
            continue
        batch = mv[pos:pos + h.size]
        if h.is_control:
            try:
                ctype, _ = parse_control_record(batch)
            except Exception:
                ctype = -1
            name = {CONTROL_ABORT: "ABORT", CONTROL_COMMIT: "COMMIT"}.get(ctype, f"control {ctype}")
            fate = {CONTROL_ABORT: "aborted", CONTROL_COMMIT: "committed"}.get(ctype)
            for row in pending.pop(h.producer_id, []):
                if fate:
                    row["mark"] = fate
            if len(rows) < limit:
                rows.append({"offset": h.base_offset, "timestamp": h.max_timestamp,
                             "producer_id": h.producer_id, "control": name, "mark": "control",
                             "key": None, "value": None, "headers": []})
            continue
        for rec in iter_records(batch):
            if len(rows) >= limit:
                break                            # the rest of a large batch is not shown
            if rec.offset < offset:
                continue
            mark = ""
            if h.is_transactional:
                mark = "open"
                if any(pid == h.producer_id and first <= rec.offset for pid, first in listed):
                    mark = "aborted"
            row = {"offset": rec.offset, "timestamp": rec.timestamp, "producer_id": h.producer_id,
                   "control": None, "mark": mark, "key": rec.key, "value": rec.value,
                   "headers": rec.headers}
            rows.append(row)
            if mark == "open":
                pending.setdefault(h.producer_id, []).append(row)
    return rows


def show(data: bytes | None, how: str) -> str:
    """Bytes as the page shows them: ``text`` (UTF-8, undecodable bytes escaped), ``json``
    (pretty-printed when it parses, else as text) or ``hex``."""
    if data is None:
        return "null"
    cut = len(data) > SHOWN_BYTES
    data = data[:SHOWN_BYTES]
    if how == "hex":
        out = data.hex(" ")
    elif how == "json":
        try:
            out = json.dumps(json.loads(data), indent=2, ensure_ascii=False)
        except (ValueError, UnicodeDecodeError):
            out = data.decode("utf-8", "backslashreplace")
    else:
        out = data.decode("utf-8", "backslashreplace")
    return out + (" …" if cut else "")

