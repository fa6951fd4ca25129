"""Produce (key 0), versions 3-11: validate each partition's batch, hand it to its writer.

Runs in frontends. Per batch, never per record: ``validate_batch`` checks size, magic, CRC-32C and
the record count against the last offset delta; the writer assigns the base offset and appends.
With acks=0 no response is sent; if such a request has an error, the connection is closed instead
(as Kafka does, so that the producer notices).

Produce 12 (KIP-890 part 2) is advertised only once transactions support it (issue 4).
"""

from __future__ import annotations

import asyncio

from appliance.api import handles
from appliance.errors import ErrorCode, KafkaError
from appliance.protocol.fetch_response import ProducePartition, ProduceTopic, encode_produce_response
from appliance.protocol.records import validate_batch
from appliance.server.broker import ProduceResult

def _max_bytes(cfg, info) -> int:
    v = info.configs.get("max.message.bytes")
    return int(v) if v is not None else cfg.log.message_max_bytes


@handles(0, "Produce", 3, 11)
async def handle(ctx, req):
    broker = ctx.broker
    catalog = broker.catalog
    acks = req.acks
    timeout_s = max(req.timeout.total_seconds(), 0.001) if req.timeout is not None else 30.0
    pending: list[tuple[str, int, object]] = []   # (topic, partition, result or future)
    any_error = False
    for td in req.topic_data:
        info = catalog.topics.get(td.name)
        for pd in td.partition_data:
            if acks not in (0, 1, -1):
                res = ProduceResult(int(ErrorCode.invalid_required_acks))
            elif info is None or not 0 <= pd.index < info.partitions:
                res = ProduceResult(int(ErrorCode.unknown_topic_or_partition))
            else:
                try:
                    validate_batch(pd.records or b"", _max_bytes(broker.cfg, info), produce_version=ctx.version)
                except KafkaError as e:
                    res = ProduceResult(int(e.code), error_message=e.message)
                else:
                    res = broker.produce(info, pd.index, acks, pd.records, timeout_s)
            if isinstance(res, ProduceResult) and res.error_code:
                any_error = True
            pending.append((td.name, pd.index, res))
    if acks == 0:
        if any_error:
            ctx.connection._abort("error in a produce request with acks=0")
        return None
    futures = [r for _, _, r in pending if isinstance(r, asyncio.Future)]
    if futures:
        await asyncio.gather(*futures)
    by_topic: dict[str, ProduceTopic] = {}
    for name, index, r in pending:
        if isinstance(r, asyncio.Future):
            r = r.result()
        topic = by_topic.get(name)
        if topic is None:
            topic = by_topic[name] = ProduceTopic(name, None)
        topic.partitions.append(ProducePartition(index, r.error_code, r.base_offset, r.log_append_time,
                                                 r.log_start_offset, (), r.error_message))
    return encode_produce_response(ctx.version, list(by_topic.values()))
