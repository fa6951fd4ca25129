"""Kafka error codes and the exceptions that carry them.

Owns nothing; imported by every process. The codes are kio's ``ErrorCode`` enum (generated from
Kafka's own definitions, with each code's retriable flag) so that no table here is kept by hand.
Handlers raise ``KafkaError(code, message)``; the frontend turns it into the error field of the
response for the API that raised it.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "KafkaError", "CorruptRecord", "InvalidRecord", "ProtocolViolation"]


class KafkaError(Exception):
    """An error with a Kafka error code, to be returned to the client in the response."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


class CorruptRecord(KafkaError):
    """A record batch failed its CRC or its framing (CORRUPT_MESSAGE)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.corrupt_message, message)


class InvalidRecord(KafkaError):
    """A record batch is well formed but not acceptable (INVALID_RECORD)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.invalid_record, message)


class ProtocolViolation(Exception):
    """The peer broke the framing or header rules; Kafka closes the connection for these."""
