"""Client quotas' pure parts: Kafka's checks of AlterClientQuotas, the filter of
DescribeClientQuotas, KIP-55's precedence, the windowed rate and throttle time
(appliance.quota.model, appliance.quota.rates), and the durable store."""

import json
import os

import pytest

from appliance.errors import ErrorCode
from appliance.quota import model, rates
from appliance.quota.store import QuotaStore, QuotasView, publish, read_published

INVALID = int(ErrorCode.invalid_request)
U = model.USER
C = model.CLIENT_ID


def test_alter_checks_are_kafkas():
    ops = lambda *o: list(o)        # noqa: E731
    alterations = [
        ([(U, "alice")], ops(("producer_byte_rate", 1024.0, False), ("request_percentage", 12.5, False))),
        ([], ops(("producer_byte_rate", 1.0, False))),
        ([("group", "g")], ops(("producer_byte_rate", 1.0, False))),
        ([(U, "")], ops(("producer_byte_rate", 1.0, False))),
        ([(U, "bob1")], ops(("nonsense", 1.0, False))),
        ([(U, "bob2")], ops(("producer_byte_rate", 0.0, False))),
        ([(U, "bob3")], ops(("producer_byte_rate", 1.5, False))),
        ([(U, "bob4")], ops(("producer_byte_rate", 1.0, False), ("producer_byte_rate", 2.0, False))),
        ([(model.IP, "127.0.0.1"), (U, "bob")], ops(("connection_creation_rate", 1.0, False))),
        ([(model.IP, "127.0.0.1")], ops(("producer_byte_rate", 1.0, False))),
        ([(model.IP, None)], ops(("connection_creation_rate", 5.0, False))),
        ([(U, "alice")], ops(("consumer_byte_rate", 1.0, False))),
        ([(C, None), (U, None)], ops(("consumer_byte_rate", 2048.0, False))),
    ]
    new, results = model.alter({}, alterations)
    assert results == [
        (0, None),
        (INVALID, "Invalid empty client quota entity"),
        (INVALID, "Unhandled client quota entity type: group"),
        (INVALID, "Empty user not supported"),
        (INVALID, "Invalid configuration key nonsense"),
        (INVALID, "Quota producer_byte_rate must be greater than 0"),
        (INVALID, "producer_byte_rate cannot be a fractional value."),
        (INVALID, "Duplicate quota key producer_byte_rate not updating quota for this entity "
                  "ClientQuotaEntity(entries={user=bob4})"),
        (INVALID, "Invalid quota entity combination, IP entity shouldnot be combined with User "
                  "or ClientId"),
        (INVALID, "Invalid configuration key producer_byte_rate"),
        (0, None),
        (INVALID, "Ignoring duplicate entity ClientQuotaEntity(entries={user=alice})"),
        (0, None),
    ]
    assert new == {((U, "alice"),): {"producer_byte_rate": 1024.0, "request_percentage": 12.5},
                   ((model.IP, None),): {"connection_creation_rate": 5.0},
                   ((C, None), (U, None)): {"consumer_byte_rate": 2048.0}}
    # Removing the last key removes the entity; removing what is not there is no error.
    new2, results = model.alter(new, [([(model.IP, None)], [("connection_creation_rate", 0, True)]),
                                      ([(U, "zed")], [("producer_byte_rate", 0, True)])])
    assert results == [(0, None), (0, None)] and ((model.IP, None),) not in new2


def test_describe_filter_is_kafkas():
    quotas = {((U, "alice"),): {"producer_byte_rate": 1.0},
              ((C, "c1"), (U, "alice")): {"consumer_byte_rate": 2.0},
              ((U, None),): {"request_percentage": 3.0},
              ((C, "c1"),): {"producer_byte_rate": 4.0}}
    got = lambda comps, strict=False: {e for e, _ in model.describe(quotas, comps, strict)}  # noqa: E731
    assert got([(U, 0, "alice")]) == {((C, "c1"), (U, "alice")), ((U, "alice"),)}
    assert got([(U, 0, "alice")], strict=True) == {((U, "alice"),)}
    assert got([(U, 1, None)]) == {((U, None),)}
    assert got([(U, 2, None)], strict=True) == {((U, None),), ((U, "alice"),)}
    assert len(got([])) == 4 and got([], strict=True) == set()
    assert got([(C, 2, None), (U, 0, "alice")]) == {((C, "c1"), (U, "alice"))}
    for comps, code, msg in [
        ([("", 0, "x")], INVALID, "Invalid empty entity type."),
        ([(U, 0, "a"), (U, 2, None)], INVALID, "Entity type user cannot appear more than once in the filter."),
        ([("group", 0, "a")], int(ErrorCode.unsupported_version), "Unsupported entity type group"),
        ([(U, 0, None)], INVALID, "Request specified MATCH_TYPE_EXACT, but set match string to null."),
        ([(U, 1, "x")], INVALID, "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."),
        ([(U, 2, "x")], INVALID, "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."),
        ([(U, 7, None)], INVALID, "Unknown match type 7"),
        ([(model.IP, 2, None), (U, 2, None)], INVALID, "Invalid entity filter component combination. "
         "IP filter component should not be used with user or clientId filter component."),
    ]:
        with pytest.raises(model.QuotaError) as e:
            model.describe(quotas, comps, False)
        assert (int(e.value.code), e.value.message) == (code, msg)


def test_precedence_is_kip_55s_eight_levels_in_order():
    levels = [((C, "c"), (U, "u")), ((C, None), (U, "u")), ((U, "u"),), ((C, "c"), (U, None)),
              ((C, None), (U, None)), ((U, None),), ((C, "c"),), ((C, None),)]
    tags = [("u", "c"), ("u", "c"), ("u", ""), ("u", "c"), ("u", "c"), ("u", ""), ("", "c"), ("", "c")]
    table = {e: float(i + 1) for i, e in enumerate(levels)}
    for i in range(len(levels)):
        # with levels i.. configured, level i governs, with Kafka's metric tags
        assert model.governing({e: v for e, v in table.items() if v > i}, "u", "c") == (i + 1.0, tags[i])
    assert model.governing({((U, "other"),): 1.0}, "u", "c") is None
    # An empty client id is held to user quotas only (Kafka's callback needs a name).
    assert model.governing({((C, None),): 1.0}, "u", "") is None
    assert model.governing({((C, None),): 1.0, ((U, None),): 2.0}, "u", "") == (2.0, ("u", ""))
    assert model.user_of("User:alice") == "alice"


def test_rate_and_throttle_time_are_kafkas():
    q = rates.ClientQuotas(window_num=11, window_size_s=1)
    q.configure({((C, "c"),): {"producer_byte_rate": 1000.0}})
    assert q.any and q.enabled[rates.PRODUCE] and not q.enabled[rates.FETCH]
    # A new client is measured over (num - 1) whole windows: 10,000 bytes at once is the bound.
    assert q.record(rates.PRODUCE, "u", "c", 10000, 0) == 0
    # 1,000 more: rate 1,100/s over 10 s; throttle (1100 - 1000) / 1000 * 10 s = 1 s.
    assert q.record(rates.PRODUCE, "u", "c", 1000, 0) == 1000
    # Another client id is not held to it; a client with no quota records nothing.
    assert q.record(rates.PRODUCE, "u", "d", 10**9, 0) == 0 and ("Produce", ("", "d")) not in q.sensors
    # Samples older than the window no longer count.
    assert q.record(rates.PRODUCE, "u", "c", 1, 11001) == 0


def test_a_throttled_fetchs_bytes_are_taken_back():
    """Kafka's handleFetchRequest: a throttled fetch sends no records, so its bytes are unrecorded
    (unrecordQuotaSensor) and only what was sent counts against consumer_byte_rate."""
    q = rates.ClientQuotas(window_num=11, window_size_s=1)
    q.configure({((C, "c"),): {"consumer_byte_rate": 1000.0}})
    assert q.record(rates.FETCH, "u", "c", 10000, 0) == 0
    assert q.record(rates.FETCH, "u", "c", 1000, 0) == 1000        # throttled: not sent
    q.unrecord(rates.FETCH, "u", "c", 1000, 0)
    assert q.measure(rates.FETCH, ("", "c"), 0)[0] == 1000.0         # the 10,000 sent, over 10 s
    # No quota governs another client: nothing to take back, no sensor made.
    q.unrecord(rates.FETCH, "u", "d", 1000, 0)
    assert ("Fetch", ("", "d")) not in q.sensors


def test_controller_mutation_rate_is_kip_599s_token_bucket():
    """A burst of rate x window_num x window size tokens, refilled at the rate; strict: refused
    while below zero, else taken even past it; permissive: always taken; the throttle is the time
    back to zero (Kafka's ControllerMutationQuotaManager)."""
    q = rates.ClientQuotas(window_num=11, window_size_s=1)
    q.configure({((C, "c"),): {"controller_mutation_rate": 2.0}})
    assert q.enabled[rates.MUTATION] and q.any
    assert q.mutation("u", "c", 20, 0, strict=True) == (True, 0)           # 22 tokens -> 2
    assert q.mutation("u", "c", 5, 0, strict=True) == (True, 1500)          # -> -3: 1.5 s back
    assert q.mutation("u", "c", 1, 0, strict=True) == (False, 1500)         # below zero: refused
    assert q.mutation("u", "c", 1, 0, strict=False) == (True, 2000)         # permissive: -4
    assert q.mutation("u", "c", 1, 2000, strict=True) == (True, 500)        # refilled to 0: -1
    q.unmutate("u", "c", 1)                                                 # not created: back to 0
    assert q.mutation("u", "c", 1, 2000, strict=True) == (True, 500)
    assert q.mutation("u", "d", 10**6, 0, strict=True) == (True, 0)         # no quota governs d
    assert q.mutation("u", "c", 0, 10**9, strict=True) == (True, 0)         # full again, capped at 22
    assert q.buckets[("", "c")].tokens == 22.0


def test_request_percentage_throttle_is_bounded_by_one_window():
    q = rates.ClientQuotas(window_num=11, window_size_s=1)
    q.configure({((U, None),): {"request_percentage": 1.0}})
    assert q.record(rates.REQUEST, "u", "c", 5e9 * rates.NANOS_TO_PERCENTAGE, 0) == 1000


def test_a_client_on_two_frontends_is_held_to_one_rate():
    """Each frontend counts its own connections; the other's published samples are added."""
    quotas = {((C, "c"),): {"producer_byte_rate": 1000.0}}
    fe0, fe1 = rates.ClientQuotas(2, 1), rates.ClientQuotas(2, 1)
    fe0.configure(quotas)
    fe1.configure(quotas)
    assert fe0.record(rates.PRODUCE, "u", "c", 1000, 0) == 0      # 1,000 over 1 s: at the bound
    fe1.merge("fe0", fe0.snapshot(0))
    # fe1 sees fe0's 1,000: 500 more is 1,500/s, throttled 500 ms; alone it would not be.
    assert fe1.record(rates.PRODUCE, "u", "c", 500, 0) == 500
    alone = rates.ClientQuotas(2, 1)
    alone.configure(quotas)
    assert alone.record(rates.PRODUCE, "u", "c", 500, 0) == 0
    fe1.merge("fe0", None)                      # fe0 gone: its samples no longer count
    assert fe1.measure(rates.PRODUCE, ("", "c"), 0)[0] == 500.0
    snap = rates.decode_snapshot(fe1.snapshot(0))
    (sensor,) = snap["sensors"]
    assert sensor[:3] == ["Produce", "", "c"] and sensor[5:7] == [0, 0]


def test_connection_creation_rate_by_address_then_default():
    q = rates.ClientQuotas(2, 1)
    q.configure({((model.IP, None),): {"connection_creation_rate": 2.0},
                 ((model.IP, "10.0.0.7"),): {"connection_creation_rate": 100.0}})
    assert [q.connection("10.0.0.1", 0) for _ in range(3)] == [0, 0, 500]
    assert all(q.connection("10.0.0.7", 0) == 0 for _ in range(50))


def test_store_is_durable_and_published(tmp_path):
    s = QuotaStore(str(tmp_path))
    results = s.alter([([(U, "alice")], [("producer_byte_rate", 1024.0, False)])], validate_only=True)
    assert results == [(0, None)] and s.quotas == {} and not os.path.exists(s.path)
    s.alter([([(U, "alice")], [("producer_byte_rate", 1024.0, False)]),
             ([(C, None)], [("consumer_byte_rate", 5.0, False)])], validate_only=False)
    again = QuotaStore(str(tmp_path))
    assert again.load() == s.quotas and again.version == s.version == 1
    # A damaged file is refused, never taken as empty.
    with open(s.path) as f:
        raw = json.load(f)
    raw["version"] = 7
    with open(s.path, "w") as f:
        json.dump(raw, f)
    with pytest.raises(ValueError):
        QuotaStore(str(tmp_path)).load()
    pub = str(tmp_path / "client_quotas.msgpack")
    publish(s.quotas, pub)
    assert read_published(pub) == s.quotas
    version = [3]
    view = QuotasView(pub, lambda: version[0])
    assert view.get() == (s.quotas, True) and view.get() == (s.quotas, False)


def test_regression_a_quota_described_before_the_frontends_tick_was_never_enforced(tmp_path):
    # DescribeClientQuotas read the frontend's view first and took its "changed" flag: the
    # accounting kept its old table (no quota) until the next change of the quotas.
    import types

    from workers.frontend.client_quotas import QuotaShell
    pub = str(tmp_path / "client_quotas.msgpack")
    version = [0]
    worker = types.SimpleNamespace(
        topo=types.SimpleNamespace(file_path=lambda name: str(tmp_path / name)),
        ctx=types.SimpleNamespace(name="fe0", frontends=["fe0"]),
        sup_page=types.SimpleNamespace(read=lambda: types.SimpleNamespace(quotas_version=version[0])))
    shell = QuotaShell(worker, types.SimpleNamespace(window_num=2, window_size_seconds=1))
    assert not shell.quotas.any
    s = QuotaStore(str(tmp_path))
    s.alter([([(C, "capped")], [("producer_byte_rate", 1024.0, False)])], validate_only=False)
    publish(s.quotas, pub)
    version[0] = 1
    assert shell.current() == s.quotas           # what DescribeClientQuotas shows ...
    assert shell.quotas.any                      # ... is what this frontend enforces
    shell.view.get()                             # another reader first, then the tick
    shell.refresh()
    assert shell.quotas.any
