"""The topic catalog: which topics exist, their ids, partition counts and config overrides, and
the dynamic broker configs (Kafka's KIP-226).

Owned (read-write) by the supervisor alone, which commits it to ``<data_dir>/catalog.json`` (the
commit point of CreateTopics, DeleteTopics, CreatePartitions and AlterConfigs:
``appliance.supervisor.catalog_store``) and publishes it to the others. The package holds what
every process shares of it:

- ``model``: the immutable snapshot (``Catalog``, ``TopicInfo``) and the house's topic names
  (internal topics, the topic-name rules, topic ids);
- ``view``: the published copy in the runtime dir and each worker's ``CatalogView``;
- ``messages``: the ring messages by which frontends ask the supervisor to change it.

Where its files lie in the data dir is ``appliance.data_layout``.
"""
