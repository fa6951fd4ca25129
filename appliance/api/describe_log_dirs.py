"""DescribeLogDirs (key 35), versions 1-5: the one log dir (``server.data_dir``), the size of
each partition in it, and (v4) the file system's total and usable bytes.

Runs in frontends. A partition's size is what its log holds: the sealed segments' files (trimmed
to their real size when they rolled) plus the active segment up to the end its writer published
(the active file is preallocated, so its length on disk says nothing). There are no future
replicas and no followers: offset lag 0, is_future_key false. Needs Describe on the Cluster.
"""

from __future__ import annotations

import datetime
import os

from appliance.acl.model import AclOperation
from appliance.api import handles
from appliance.data_layout import partition_dir
from appliance.errors import ErrorCode
from appliance.log.files import list_segment_bases, log_path
from appliance.protocol.messages import build


def partition_size(directory: str, active_base: int, active_end: int) -> int:
    total = active_end
    try:
        bases = list_segment_bases(directory)
    except FileNotFoundError:
        return 0
    for base in bases:
        if base < active_base:
            try:
                total += os.stat(log_path(directory, base)).st_size
            except FileNotFoundError:
                pass                     # retention deleted it meanwhile
    return total


@handles(35, "DescribeLogDirs", 1, 5)
def handle(ctx, req):
    broker = ctx.broker
    catalog = broker.catalog
    if not ctx.authorize_cluster(AclOperation.DESCRIBE):
        # Kafka's KafkaApis: Describe on the Cluster, else no log dir at all (v3+ says why).
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.cluster_authorization_failed, results=())
    data_dir = os.path.abspath(broker.ctx.data_dir)
    if req.topics is None:
        wanted = [(t, range(t.partitions)) for t in sorted(catalog.topics.values(), key=lambda t: t.name)]
    else:
        wanted = []
        for rt in req.topics:
            info = catalog.topics.get(rt.topic)
            if info is not None:
                wanted.append((info, [p for p in rt.partitions if 0 <= p < info.partitions]))
    topics = []
    for info, partitions in wanted:
        parts = []
        for p in partitions:
            st = broker.partition_state(info, p)
            if st is None:
                continue
            size = partition_size(partition_dir(data_dir, info.name, p), st.active_base_offset,
                                  st.active_end_position)
            parts.append(dict(partition_index=p, partition_size=size, offset_lag=0, is_future_key=False))
        if parts:
            topics.append(dict(name=info.name, partitions=tuple(parts)))
    fs = os.statvfs(data_dir)
    result = dict(error_code=ErrorCode.none, log_dir=data_dir, topics=tuple(topics),
                  total_bytes=fs.f_blocks * fs.f_frsize, usable_bytes=fs.f_bavail * fs.f_frsize,
                  # v5 (KIP-1066): the one log dir is never cordoned here
                  is_cordoned=False)
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
                 results=(result,))
