"""Kafka's dynamic broker config names that the appliance stores and reports but has nothing to
apply them to (KIP-226's ``DynamicBrokerConfig.AllDynamicConfigs`` less the log defaults, which
``appliance.topic_config`` applies live, and less what the appliance sets from its TOML file).

Owns nothing; a table read by the supervisor (IncrementalAlterConfigs / AlterConfigs of a
broker resource, ``topic_config.alter_broker_configs``) and the frontends (DescribeConfigs).

A Kafka tool or test that sets, say, ``sasl.kerberos.min.time.before.relogin`` on a broker gets
what a Kafka broker answers: the value is stored in the catalog (``broker_node`` or
``broker_default``) and DescribeConfigs shows it as a DYNAMIC_BROKER_CONFIG. The names the
appliance configures from its TOML file (listeners, its TLS and SASL settings, connection
limits, the cleaner, producer-id expiration) stay refused with Kafka's INVALID_REQUEST
"Cannot update these configs dynamically": storing them would report a value it does not run
with.
"""

from __future__ import annotations

# name -> Kafka ConfigEntry type (what DescribeConfigs reports and the value is checked as).
STORED_DYNAMIC_BROKER_CONFIGS: dict[str, str] = {
    # DynamicListenerConfig: SASL's Kerberos and login-refresh settings (no GSSAPI/OAUTHBEARER
    # login here to refresh).
    "sasl.kerberos.service.name": "STRING",
    "sasl.kerberos.kinit.cmd": "STRING",
    "sasl.kerberos.ticket.renew.window.factor": "DOUBLE",
    "sasl.kerberos.ticket.renew.jitter": "DOUBLE",
    "sasl.kerberos.min.time.before.relogin": "LONG",
    "sasl.kerberos.principal.to.local.rules": "LIST",
    "sasl.login.refresh.window.factor": "DOUBLE",
    "sasl.login.refresh.window.jitter": "DOUBLE",
    "sasl.login.refresh.min.period.seconds": "SHORT",
    "sasl.login.refresh.buffer.seconds": "SHORT",
    "sasl.mechanism.inter.broker.protocol": "STRING",
    # JVM TLS settings with no counterpart in Python's ssl module.
    "ssl.provider": "STRING",
    "ssl.keymanager.algorithm": "STRING",
    "ssl.trustmanager.algorithm": "STRING",
    "ssl.secure.random.implementation": "STRING",
    "ssl.engine.factory.class": "CLASS",
    "principal.builder.class": "CLASS",
    # DynamicThreadPool: the appliance's processes are laid out by its TOML file and cores.
    "num.io.threads": "INT",
    "num.replica.fetchers": "INT",
    "num.recovery.threads.per.data.dir": "INT",
    "background.threads": "INT",
    "num.network.threads": "INT",
    "metric.reporters": "LIST",
    # LogCleaner's JVM buffer settings (the cleaner here reads segments by mmap).
    "log.cleaner.io.buffer.size": "INT",
    "log.cleaner.io.buffer.load.factor": "DOUBLE",
    "log.cleaner.dedupe.buffer.load.factor": "DOUBLE",
    # DynamicProducerStateManagerConfig: verification (KIP-890) is always on here.
    "transaction.partition.verification.enable": "BOOLEAN",
    # DynamicRemoteLogConfig: tiered storage is not offered; its broker tuning is only stored.
    "remote.log.index.file.cache.total.size.bytes": "LONG",
    "remote.fetch.max.wait.ms": "INT",
    "remote.log.manager.copy.max.bytes.per.second": "LONG",
    "remote.log.manager.fetch.max.bytes.per.second": "LONG",
    "remote.list.offsets.request.timeout.ms": "LONG",
}

SENSITIVE_TYPES = ("PASSWORD",)


def check_typed(ctype: str, value: str) -> str | None:
    """Kafka's ConfigDef parse of a dynamic broker value by type: an error text or None."""
    try:
        if ctype in ("INT", "SHORT", "LONG"):
            n = int(value.strip())
            bits = {"SHORT": 15, "INT": 31, "LONG": 63}[ctype]
            if not -(2**bits) <= n < 2**bits:
                return f"value {n} is out of range for a {ctype}"
        elif ctype == "DOUBLE":
            float(value.strip())
        elif ctype == "BOOLEAN" and value.strip().lower() not in ("true", "false"):
            return f"value {value!r} is not true or false"
    except ValueError:
        return f"value {value!r} is not a {ctype}"
    return None
