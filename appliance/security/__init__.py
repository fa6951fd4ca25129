"""Authentication: TLS (``tls``), SASL (``sasl``), SCRAM credentials (``scram``,
``credentials``) and connection principals (``principal``). See each module for the process that
runs it."""
