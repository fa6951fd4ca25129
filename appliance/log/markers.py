"""MarkerWriter: the COMMIT/ABORT markers of one partition (KIP-98), in their order.

Owned by the partition's writer process (``workers/partition_writer.py`` calls it for each
``WriteMarkerRequest``, from the coordinator's TransactionMarkerChannelManager or a frontend's
WriteTxnMarkers; single-threaded). It works on the ``Partition`` it is given (log, producer
state, KIP-939 fences) and owns only whether the last abort marker failed (so that a full disk
is reported once). No rings: the writer answers, publishes and holds the answer for the group
commit.

A marker, in this order (Kafka's appendEndTxnMarker, then the aborted-transaction index):

1. the producer state's checks (INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED), then
   the control batch appended (``PartitionLog.append_control``);
2. an ABORT is indexed (``.txnindex``) before the LSO moves past the marker (the writer publishes
   at the end of its turn) and before the producer state takes the marker: if the disk cannot
   take the entry, the marker is taken back out of the log (``PartitionLog.undo_control``) and the
   coordinator, answered KAFKA_STORAGE_ERROR, sends it again (Kafka's marker channel retries it),
   with the producer state as it was;
3. the producer state ends the transaction (``complete_txn``), and a KIP-939 fence at or below
   the marker's epoch is lifted (the marker's epoch fences from now on).
"""

from __future__ import annotations

import logging

from appliance import ipc
from appliance.errors import ErrorCode, KafkaError
from appliance.log.partition import Partition
from appliance.log.txn_index import AbortedTxn

__all__ = ["MarkerWriter"]

log = logging.getLogger("appliance.writer")


class MarkerWriter:
    def __init__(self, partition: Partition) -> None:
        self.partition = partition
        self.trouble = False         # an abort marker failed (full disk): logged once

    def write(self, m: ipc.WriteMarkerRequest, now_ms: int) -> tuple[ErrorCode, int]:
        """Append a COMMIT/ABORT marker, end the producer's transaction here, index an abort.
        Returns (error code, offset just past the marker); on NONE the page is to be published
        (the LSO moved)."""
        part = self.partition
        lg, psm = part.log, part.psm
        try:
            psm.check_marker(m.producer_id, m.producer_epoch, m.coordinator_epoch)
            info = lg.append_control(m.producer_id, m.producer_epoch, m.commit,
                                     m.coordinator_epoch, now_ms)
        except KafkaError as e:
            return e.code, 0
        if not m.commit:
            # The aborted-transaction entry, before the LSO moves past the marker (published at
            # the end of this turn) and before the producer's state takes the marker: if the
            # disk cannot take it, the marker is taken back out of the log and the coordinator,
            # answered KAFKA_STORAGE_ERROR, sends it again (Kafka's marker channel retries it).
            first, lso = psm.preview_completion(m.producer_id, info.base_offset,
                                                lg.log_end_offset)
            try:
                lg.append_aborted(AbortedTxn(m.producer_id, first, info.last_offset, lso))
            except OSError as e:
                # Logged once while the disk stays full: the coordinator resends every marker
                # about ten times a second (regression: a full disk flooded the log with it).
                if not self.trouble:
                    log.warning("%s-%d: abort marker of producer %d not written (markers are sent "
                                "again until the disk takes them; logged once): %s",
                                part.topic, part.index, m.producer_id, e)
                self.trouble = True
                lg.undo_control(info)
                return ErrorCode.kafka_storage_error, 0
            if self.trouble:
                log.info("%s-%d: abort markers are written again", part.topic, part.index)
                self.trouble = False
        psm.complete_txn(m.producer_id, m.producer_epoch, m.coordinator_epoch,
                         info.base_offset, not m.commit, now_ms)
        fenced = part.fenced
        if m.producer_id in fenced and fenced[m.producer_id] <= m.producer_epoch:
            del fenced[m.producer_id]          # the marker's epoch fences it from now on
        return ErrorCode.none, info.last_offset + 1
