"""The log cleaner: compaction of topics whose cleanup.policy has "compact" (Kafka's LogCleaner).

Run by the cleaner processes (``workers/cleaner.py``, ``[log.cleaner] processes`` of them), and
by tests in their own process. The cleaner only reads a partition's segments (read-only maps) and
writes new files beside them; the partition's writer alone swaps them in (``appliance.log.swap``).

- ``plan``: which partition to clean and what (Kafka's LogCleanerManager): the first dirty
  offset, the first uncleanable offset, the dirty ratio, groups of segments.
- ``offset_map``: the bounded key -> latest offset map of the dirty section.
- ``txn_meta``: transactions while cleaning (KIP-98, "Compacting Transactional Data").
- ``clean``: one cleaning round: the map, then each group of segments rewritten into
  ``<base>.<suffix>.cleaned`` files and handed over for the swap.
"""
