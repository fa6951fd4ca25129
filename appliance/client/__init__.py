"""The appliance's own Kafka client, on the broker's codec (``appliance.protocol``).

A small, synchronous, single-threaded client: bootstrap and metadata, an idempotent and
transactional ``Producer`` (batching per partition, acks, retries that keep their sequence
numbers, compression) with KIP-939's two-phase commit API (``prepare_transaction``,
``complete_transaction``, ``init_transactions(keep_prepared_txn=True)``, ``PreparedTxnState``),
and a ``Consumer`` by assignment that reads read_committed by default. Speaks transaction
version 2 (KIP-890) when the broker offers it, the plain protocol otherwise or on request.

Modules: ``connection`` (socket, framing, ApiVersions), ``metadata`` (brokers, leaders,
coordinators, retry deadlines), ``accumulator`` (buffers, batches, sequences), ``transactions``
(producer id/epoch and the transaction state machine), ``producer``, ``consumer``, ``config``,
``errors``.
"""

from appliance.client.accumulator import Delivery
from appliance.client.consumer import Consumer, ConsumerRecord
from appliance.client.errors import (FatalProducerError, IllegalStateError, KafkaConnectionError,
                                     KafkaError, KafkaTimeoutError, ProducerFencedError,
                                     TransactionAbortableError)
from appliance.client.producer import Producer
from appliance.client.transactions import PreparedTxnState

__all__ = ["Producer", "Consumer", "ConsumerRecord", "Delivery", "PreparedTxnState", "KafkaError",
           "KafkaConnectionError", "KafkaTimeoutError", "IllegalStateError",
           "TransactionAbortableError", "FatalProducerError", "ProducerFencedError"]
