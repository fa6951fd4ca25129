"""One partition's storage, in Kafka's on-disk layout (segments of record batches + indexes).

Written by exactly one process, the partition writer (``partition_log.PartitionLog``); read by
any number of others through read-only maps (``reader.LogReader``, ``reader.SegmentViews``).

- ``files``: names of the files in a partition directory, checkpoints, atomic replacement.
- ``index``: Kafka's offset and time indexes (memory maps; readers find the valid entries).
- ``segment``: the writer's active segment; loading and recovering segment files.
- ``partition_log``: the writer's object (append, roll, flush, retention, recovery at open).
- ``partition``: the partition as its writer holds it (log, producer state, KIP-939 fences, the
  KIP-932 share-state slot) and the requests answered from it (DeleteRecords, DescribeProducers,
  the cleaner's begin and swap); its sans-IO collaborators, whose methods say what the writer's
  shell (``workers/partition_writer.py``) is to do: ``verification`` (KIP-890), ``markers``
  (COMMIT/ABORT markers, their order and undo), ``group_commit`` (when answers may leave).
- ``reader``: fetch ranges and timestamp lookups for other processes.
- ``compacted_log``: the coordinator worker's logs compacted by rewrite (the transaction-state
  log, the group log), each one ``PartitionLog`` plus a crash-safe swap.
- ``cleaner``: the log cleaner of compacted topics (run by the cleaner processes): plan, key map,
  rewrite into ``.cleaned`` copies.
- ``swap``: the writer's side of a cleaner round: the crash-safe swap of the copies, and its
  completion at open.
"""
