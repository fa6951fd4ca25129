"""Kafka's transaction coordinator (KIP-98, KIP-890, KIP-939), for one node.

Runs in the coordinator worker (``workers/coordinator.py``), single-threaded, except
``messages``, which frontends and partition writers import too. See each module for what it
owns:

- ``coordinator``: ``TransactionCoordinator``, the entry point: life cycle, AddPartitionsToTxn,
  AddOffsetsToTxn, KIP-890 verification, KIP-939 fences, admin queries; composes the rest;
- ``metadata_cache``: ``TxnMetadataCache``, the state every collaborator is handed (metadata by
  transactional id, copy-on-write append, the gate, producer ids, clock, counters);
- ``init_producer_id``, ``end_txn``, ``expiry``: ``InitProducerIdHandler``, ``EndTxnHandler``,
  ``TxnExpiry``, the collaborators;
- ``marker_channel``: ``TransactionMarkerChannelManager``, the marker jobs and their delivery;
- ``service``: ``TransactionService``, the ring requests served with the coordinator;
- ``state_manager``, ``records``: the transaction-state log on disk and its records;
- ``metadata``: states, the transition table, ``TransactionMetadata``; ``producer_ids``: id
  blocks; ``admin``: ListTransactions / DescribeTransactions; ``messages``: the ring messages.
"""
