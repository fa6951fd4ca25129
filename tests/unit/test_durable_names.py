"""Names that must survive a power cut: a new partition's directory and first segment are synced
by its first flush (before any batch can be durable), a directory ``make_dirs`` creates has its
parent synced. The power cut itself: tests/integration/test_power_cut.py."""

import os

from appliance import durable
from appliance.log import log_loader as LL
from appliance.log import partition_log as PL
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.protocol.records import Record, build_batch

T0 = 1_700_000_000_000
S = LogSettings(segment_bytes=1 << 20, index_interval_bytes=100, segment_index_bytes=4096,
                retention_ms=-1, retention_bytes=-1)


def test_the_first_flush_after_each_open_syncs_the_partition_directory_and_the_data_dir(tmp_path, monkeypatch):
    synced = []
    for module in (PL, LL):              # the open's (log_loader) and the flushes'
        monkeypatch.setattr(module, "fsync_dir", lambda d: synced.append(os.path.abspath(d)))
    part = tmp_path / "t-0"
    log = PartitionLog.open(str(part), S, T0)
    assert synced == []                           # the open stays cheap (CreateTopics)
    log.append(bytearray(build_batch([Record(b"k", b"v", [], T0)], base_timestamp=T0)), T0)
    fd, end = log.flush_target()
    os.close(fd)
    assert synced == [str(part), str(tmp_path)] and end == 1
    fd, _ = log.flush_target()                    # once only
    os.close(fd)
    assert synced == [str(part), str(tmp_path)]
    log.close(clean=False)           # as a kill -9 would leave it, before any power cut
    synced.clear()
    log = PartitionLog.open(str(part), S, T0)     # it finds the files and syncs no name...
    assert str(tmp_path) not in synced
    fd, _ = log.flush_target()                    # ...its first flush does
    os.close(fd)
    assert synced[-2:] == [str(part), str(tmp_path)]
    log.close(clean=False)


def test_make_dirs_syncs_the_parent_of_each_level_it_creates(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(durable, "fsync_dir", lambda d: synced.append(d))
    durable.make_dirs(str(tmp_path / "a" / "b"))
    assert synced == [str(tmp_path), str(tmp_path / "a")]
    assert (tmp_path / "a" / "b").is_dir()
    synced.clear()
    durable.make_dirs(str(tmp_path / "a" / "b"))
    assert synced == []
