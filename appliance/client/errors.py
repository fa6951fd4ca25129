"""The exceptions the client raises, and how it classifies Kafka error codes.

Owns no state. Every client error is a ``KafkaError`` carrying a Kafka error code (kio's
``ErrorCode`` enum, so the names and retriable flags are Kafka's own), subclassing the broker's
``appliance.errors.KafkaError`` so that one ``except`` catches either. The subclasses say what the
caller may do next:

- ``KafkaConnectionError`` / ``KafkaTimeoutError``: the request's outcome is unknown; retriable.
- ``TransactionAbortableError``: the current transaction cannot commit; ``abort_transaction()``
  and carry on.
- ``ProducerFencedError`` and other fatal errors: the producer is unusable; close it and make a new
  one (a newer instance owns the transactional id, or the broker refused the id).
- ``IllegalStateError``: the call is not allowed in the producer's current state (a programming
  error, like Java's IllegalStateException); the state did not change.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from appliance.errors import KafkaError as _BrokerKafkaError

__all__ = [
    "ErrorCode", "KafkaError", "KafkaConnectionError", "KafkaTimeoutError", "IllegalStateError",
    "TransactionAbortableError", "ProducerFencedError", "FatalProducerError", "error_code",
    "error_for", "is_retriable", "FENCED", "ABORTABLE", "COORDINATOR_ERRORS",
]


def error_code(value: int | ErrorCode) -> ErrorCode:
    """The ErrorCode for a wire value (kio already hands ErrorCode members; ints are mapped)."""
    if isinstance(value, ErrorCode):
        return value
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.unknown_server_error


class KafkaError(_BrokerKafkaError):
    """An error with a Kafka error code. ``retriable`` is Kafka's flag for the code."""

    def __init__(self, code: int | ErrorCode, message: str | None = None) -> None:
        code = error_code(code)
        super().__init__(code, message or code.name.upper())

    @property
    def retriable(self) -> bool:
        return bool(self.code.retriable)

    @property
    def name(self) -> str:
        return self.code.name.upper()

    def __str__(self) -> str:
        msg = self.message or ""
        return f"{self.name} ({int(self.code)}): {msg}" if msg and msg != self.name else \
            f"{self.name} ({int(self.code)})"


class KafkaConnectionError(KafkaError):
    """The connection failed or was closed; the request may or may not have been processed."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.network_exception, message)


class KafkaTimeoutError(KafkaError):
    """No answer in time (a request, or a retry loop that ran out of its deadline)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.request_timed_out, message)


class IllegalStateError(KafkaError):
    """The call is not allowed now (e.g. ``send`` on a prepared transaction)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.invalid_txn_state, message)


class TransactionAbortableError(KafkaError):
    """The transaction failed and must be aborted; the producer stays usable."""


class FatalProducerError(KafkaError):
    """The producer cannot continue; close it."""


class ProducerFencedError(FatalProducerError):
    """A newer producer with the same transactional id took over (or a newer epoch exists)."""


# Codes meaning "another producer instance owns this transactional id now".
FENCED = frozenset({ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch,
                    ErrorCode.transaction_coordinator_fenced})
# Codes after which the current transaction can only be aborted.
ABORTABLE = frozenset({ErrorCode.transaction_abortable, ErrorCode.out_of_order_sequence_number,
                       ErrorCode.unknown_producer_id, ErrorCode.invalid_producer_id_mapping,
                       ErrorCode.invalid_txn_state, ErrorCode.message_too_large,
                       ErrorCode.invalid_record, ErrorCode.record_list_too_large,
                       ErrorCode.topic_authorization_failed, ErrorCode.invalid_topic_exception,
                       ErrorCode.unknown_server_error, ErrorCode.unsupported_compression_type, ErrorCode.invalid_timestamp})
# Codes that mean "find the coordinator again, then retry".
COORDINATOR_ERRORS = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available})


def is_retriable(code: ErrorCode) -> bool:
    return bool(code.retriable)


def error_for(code: int | ErrorCode, message: str | None = None, *, transactional: bool = False) -> KafkaError:
    """The exception class that fits ``code``: fenced codes are fatal, ABORTABLE ones abortable
    inside a transaction, the rest plain ``KafkaError``."""
    code = error_code(code)
    if code in FENCED:
        return ProducerFencedError(code, message)
    if transactional and code in ABORTABLE:
        return TransactionAbortableError(code, message)
    return KafkaError(code, message)
