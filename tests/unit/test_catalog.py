"""The topic catalog: durable commit point, Kafka's partition.metadata, crash sweeping."""


import pytest

from appliance.catalog.model import (Catalog, TopicInfo, check_topic_name, kafka_str_to_uuid,
                                     new_topic_id, uuid_to_kafka_str)
from appliance.supervisor.catalog_store import CatalogStore
from appliance.catalog.view import CatalogView, publish, read_published
from appliance.errors import KafkaError


def test_add_and_reload(tmp_path):
    store = CatalogStore(str(tmp_path))
    store.load()
    t = TopicInfo(name="orders", topic_id=new_topic_id(), partitions=3, configs={"retention.ms": "5"})
    store.add_topics([t])
    again = CatalogStore(str(tmp_path)).load()
    assert again.topics["orders"] == t
    assert again.by_id(t.topic_id) == t
    meta = (tmp_path / "orders-2" / "partition.metadata").read_text()
    assert meta == f"version: 0\ntopic_id: {uuid_to_kafka_str(t.topic_id)}\n"


def test_kafka_uuid_string_round_trip():
    tid = new_topic_id()
    s = uuid_to_kafka_str(tid)
    assert len(s) == 22 and "=" not in s and not s.startswith("-")
    assert kafka_str_to_uuid(s) == tid


def test_uncommitted_create_is_swept(tmp_path):
    """A crash after the partition dirs were made but before the catalog commit leaves orphans."""
    store = CatalogStore(str(tmp_path))
    store.load()
    d = tmp_path / "ghost-0"
    d.mkdir()
    (d / "partition.metadata").write_text("version: 0\ntopic_id: x\n")
    CatalogStore(str(tmp_path)).load()
    assert not d.exists()


def test_remove_then_delete_dirs(tmp_path):
    store = CatalogStore(str(tmp_path))
    store.load()
    t = TopicInfo(name="a", topic_id=new_topic_id(), partitions=2)
    store.add_topics([t])
    removed = store.remove_topics(["a", "missing"])
    assert removed == [t]
    store.delete_dirs(t)
    assert "a" not in CatalogStore(str(tmp_path)).load().topics
    assert not any(p.name.startswith("a-") for p in tmp_path.iterdir())


def test_removed_but_not_deleted_is_swept(tmp_path):
    store = CatalogStore(str(tmp_path))
    store.load()
    t = TopicInfo(name="a", topic_id=new_topic_id(), partitions=1)
    store.add_topics([t])
    store.remove_topics(["a"])
    assert (tmp_path / "a-0").exists()
    CatalogStore(str(tmp_path)).load()
    assert not (tmp_path / "a-0").exists()


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "bad name", "bad/name", "ü"])
def test_illegal_topic_names(name):
    with pytest.raises(KafkaError) as e:
        check_topic_name(name)
    assert e.value.code == 17


def test_publish_and_view(tmp_path):
    c = Catalog(version=7, topics={"x": TopicInfo("x", new_topic_id(), 2, {})})
    path = str(tmp_path / "c.mp")
    publish(c, path)
    version = [7]
    view = CatalogView(path, lambda: version[0])
    assert view.get().topics["x"].partitions == 2
    c2 = Catalog(version=8, topics={})
    publish(c2, path)
    assert "x" in view.get().topics          # version not bumped yet: cached
    version[0] = 8
    assert view.get().topics == {}


def test_grow_topics_numbers_new_partitions_after_the_old_and_commits(tmp_path):
    store = CatalogStore(str(tmp_path))
    store.load()
    t = TopicInfo(name="g", topic_id=new_topic_id(), partitions=2, configs={"retention.ms": "9"})
    store.add_topics([t])
    (grown, new), = store.grow_topics({"g": 5})
    assert new == range(2, 5) and grown.partitions == 5 and grown.configs == t.configs
    assert grown.topic_id == t.topic_id
    for p in range(5):
        assert (tmp_path / f"g-{p}" / "partition.metadata").exists()
    again = CatalogStore(str(tmp_path)).load()
    assert again.topics["g"].partitions == 5


def test_configs_and_dynamic_broker_configs_persist_and_publish(tmp_path):
    store = CatalogStore(str(tmp_path))
    store.load()
    t = TopicInfo(name="c", topic_id=new_topic_id(), partitions=1, configs={"retention.ms": "9"})
    store.add_topics([t])
    v = store.catalog.version
    store.set_configs({"c": {"segment.bytes": "4096"}}, broker_default={"log.retention.ms": "1000"})
    store.set_configs({}, broker_node={"log.retention.ms": "2000", "message.max.bytes": "5000"})
    c = CatalogStore(str(tmp_path)).load()
    assert c.version == v + 2 and c.topics["c"].configs == {"segment.bytes": "4096"}
    assert c.broker_default == {"log.retention.ms": "1000"}
    assert c.broker_node == {"log.retention.ms": "2000", "message.max.bytes": "5000"}
    # the effective overrides: the node's dynamic config over the cluster default, the topic's own
    # over both, under the topic config names
    assert c.overrides(c.topics["c"]) == {"retention.ms": "2000", "max.message.bytes": "5000",
                                          "segment.bytes": "4096"}
    path = str(tmp_path / "c.mp")
    publish(c, path)
    back = read_published(path)
    assert (back.broker_default, back.broker_node) == (c.broker_default, c.broker_node)


def test_group_configs_persist_and_publish_and_an_emptied_group_goes(tmp_path):
    store = CatalogStore(str(tmp_path))
    store.load()
    store.set_configs({}, group_configs={"g1": {"consumer.session.timeout.ms": "50000"},
                                         "g2": {"share.isolation.level": "read_committed"}})
    store.set_configs({}, group_configs={"g2": {}})
    c = CatalogStore(str(tmp_path)).load()
    assert c.group_configs == {"g1": {"consumer.session.timeout.ms": "50000"}}
    path = str(tmp_path / "g.mp")
    publish(c, path)
    assert read_published(path).group_configs == c.group_configs


def test_client_metrics_resources_persist_and_publish_and_a_deleted_one_goes(tmp_path):
    store = CatalogStore(str(tmp_path))
    store.load()
    store.set_configs({}, client_metrics={"a": {"metrics": "*", "interval.ms": "1000"},
                                          "b": {"match": "client_id=x"}})
    store.set_configs({}, group_configs={"g": {"share.isolation.level": "read_committed"}},
                      client_metrics={"b": {}})
    c = CatalogStore(str(tmp_path)).load()
    assert c.client_metrics == {"a": {"metrics": "*", "interval.ms": "1000"}}
    assert c.group_configs == {"g": {"share.isolation.level": "read_committed"}}
    path = str(tmp_path / "m.mp")
    publish(c, path)
    assert read_published(path).client_metrics == c.client_metrics
