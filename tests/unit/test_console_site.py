"""The console's sans-IO parts (appliance.console): HTTP parsing, sessions and CSRF, who may change
what, the record browser's marks and formats, the Overview's rates and problems, the ACL form,
and the [console] configuration checks. No process, no socket: the browser tests
(tests/integration/test_console.py) drive the real thing."""

from __future__ import annotations

import pytest

from appliance.config import ConfigError, load
from appliance.console import records
from appliance.console.app import HEADERS, Console, Target, parse_acl, pick_target
from appliance.console.history import GroupLags, History, Totals
from appliance.console.overview import problems
from appliance.console.sessions import COOKIE, Sessions, csrf_ok
from appliance.http import BadRequest, Request, Response, add_body, encode, parse_head
from appliance.listeners import Listener
from appliance.protocol.records import Record, build_batch, build_control_batch


def test_parse_head_reads_the_request_line_headers_cookies_and_a_form():
    req, length = parse_head(b"POST /topics/create?x=1 HTTP/1.1\r\nHost: a\r\n"
                             b"Cookie: appliance_console=abc; other=1\r\n"
                             b"Content-Type: application/x-www-form-urlencoded\r\n"
                             b"Content-Length: 18\r\n\r\n")
    assert (req.method, req.path, req.query, length) == ("POST", "/topics/create", {"x": "1"}, 18)
    assert req.cookies[COOKIE] == "abc" and req.keep_alive
    add_body(req, b"name=a%20b&csrf=tk")
    assert req.form == {"name": "a b", "csrf": "tk"} and req.arg("x") == "1"


@pytest.mark.parametrize("head, status", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nContent-Length: 9999999\r\n\r\n", 413),
    (b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
])
def test_parse_head_refuses_what_it_cannot_serve(head, status):
    with pytest.raises(BadRequest) as e:
        parse_head(head)
    assert e.value.status == status


def test_a_post_that_is_not_a_form_is_refused():
    req, _ = parse_head(b"POST / HTTP/1.1\r\nContent-Type: application/json\r\n\r\n")
    with pytest.raises(BadRequest):
        add_body(req, b"{}")


def test_every_answer_forbids_framing_and_caching():
    out = encode(Response(200, b"hi"), keep_alive=False, fixed=HEADERS).decode()
    assert out.startswith("HTTP/1.1 200 OK\r\n")
    for h in ("X-Frame-Options: DENY", "frame-ancestors 'none'", "Cache-Control: no-store",
              "Connection: close", "Content-Length: 2"):
        assert h in out


def test_sessions_expire_when_idle_and_their_cookie_has_the_flags():
    ss = Sessions(idle_s=10, secure=True)
    s = ss.new(100.0, "alice", "pw", "SCRAM-SHA-512")
    assert ss.get(s.sid, 105.0) is s and s.principal == "User:alice"
    assert ss.get(s.sid, 114.0) is s                  # a request moved its idle clock
    assert ss.get(s.sid, 125.0) is None and s.sid not in ss.by_id
    cookie = ss.cookie(ss.new(200.0))
    for flag in ("HttpOnly", "SameSite=Strict", "Secure", "Path=/"):
        assert flag in cookie
    assert "Secure" not in Sessions(10, secure=False).cookie(ss.new(200.0))
    assert "Max-Age=0" in ss.cookie(None)


def test_the_oldest_session_goes_when_there_are_too_many():
    ss = Sessions(idle_s=100, secure=False, max_sessions=2)
    a, b = ss.new(1.0), ss.new(2.0)
    c = ss.new(3.0)
    assert set(ss.by_id) == {b.sid, c.sid} and a.sid not in ss.by_id


def test_csrf_token_must_match():
    s = Sessions(10, False).new(0.0)
    assert csrf_ok(s, s.csrf) and not csrf_ok(s, "") and not csrf_ok(s, s.csrf + "x")


def _console(tmp_path, protocol="PLAINTEXT", allow_changes=False):
    cfg = load(None, environ={}, overrides={"console": {"allow_changes": allow_changes}})
    lst = Listener(protocol, protocol, "127.0.0.1", 9092)
    return Console(cfg, str(tmp_path), str(tmp_path), Target("127.0.0.1:9092", lst))


def _request(method, path, form=None, cookie=None):
    return Request(method, path, {}, {}, {COOKIE: cookie} if cookie else {}, form or {})


def test_without_sasl_the_console_only_shows_unless_allowed(tmp_path):
    c = _console(tmp_path)
    s = c.sessions.new(c.clock())
    assert not c.login_required and not c.may_change(s)
    assert _console(tmp_path, allow_changes=True).may_change(s)
    # a change is refused before any Kafka request is made (there is no broker here)
    r = c.handle(_request("POST", "/topics/create", {"csrf": s.csrf, "name": "t"}, s.sid))
    assert r.status == 303 and "changes are off" in s.flash[0][1]


def test_with_sasl_every_page_needs_a_login_and_a_post_its_csrf_token(tmp_path):
    c = _console(tmp_path, "SASL_PLAINTEXT")
    assert c.login_required
    r = c.handle(_request("GET", "/topics"))
    assert r.status == 303 and ("Location", "/login?next=/topics") in r.headers
    assert c.handle(_request("POST", "/topics/create", {"name": "t"})).status == 403
    assert c.handle(_request("GET", "/api/history")).status == 403
    s = c.sessions.new(c.clock(), "alice", "pw", "SCRAM-SHA-512")
    r = c.handle(_request("POST", "/topics/create", {"name": "t", "csrf": "forged"}, s.sid))
    assert r.status == 403 and b"CSRF" in r.body
    assert c.handle(_request("GET", "/login")).status == 200
    assert c.handle(_request("GET", "/static/uPlot.iife.min.js")).status == 200
    assert c.handle(_request("GET", "/static/../app.py")).status == 404


def test_pick_target_prefers_sasl_then_plaintext():
    cfg = load(None, environ={}, overrides={"server": {
        "listeners": "PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093"},
        "tls": {"cert_file": "c", "key_file": "k"}})
    t = pick_target(cfg, {"SASL_SSL": 19093})
    assert t.sasl and t.bootstrap == "127.0.0.1:19093"
    cfg = load(None, environ={}, overrides={"server": {"listen": "127.0.0.1:0"}})
    assert pick_target(cfg, {"PLAINTEXT": 4242}).bootstrap == "127.0.0.1:4242"


def _batches(*parts: bytes) -> bytes:
    return b"".join(parts)


def test_the_browser_marks_control_records_and_the_fate_of_transactional_ones():
    plain = build_batch([Record(b"k", b"v", [("h", b"1")])], base_offset=0)
    aborted = build_batch([Record(None, b"gone")], base_offset=1, producer_id=7,
                          producer_epoch=0, transactional=True)
    abort = build_control_batch(commit=False, producer_id=7, producer_epoch=0,
                                coordinator_epoch=0, base_offset=2, timestamp_ms=0)
    committed = build_batch([Record(None, b"kept")], base_offset=3, producer_id=8,
                            producer_epoch=0, transactional=True)
    commit = build_control_batch(commit=True, producer_id=8, producer_epoch=0,
                                 coordinator_epoch=0, base_offset=4, timestamp_ms=0)
    still_open = build_batch([Record(None, b"open")], base_offset=5, producer_id=9,
                             producer_epoch=0, transactional=True)
    rows = records.decode_fetched(_batches(plain, aborted, abort, committed, commit, still_open),
                                  0, [], 100)
    assert [(r["offset"], r["mark"], r["control"]) for r in rows] == [
        (0, "", None), (1, "aborted", None), (2, "control", "ABORT"), (3, "committed", None),
        (4, "control", "COMMIT"), (5, "open", None)]
    assert rows[0]["headers"] == [("h", b"1")]
    # from an offset, with the broker's list of aborted transactions (read_committed)
    rows = records.decode_fetched(_batches(aborted), 1, [(7, 1)], 100)
    assert rows[0]["mark"] == "aborted"
    assert len(records.decode_fetched(_batches(plain, aborted, abort), 0, [], 2)) == 2


def test_values_show_as_text_json_or_hex():
    assert records.show(None, "text") == "null"
    assert records.show(b'{"a":1}', "json") == '{\n  "a": 1\n}'
    assert records.show(b"not json", "json") == "not json"
    assert records.show(b"\x00\xff", "hex") == "00 ff"
    assert records.show(b"\xff", "text") == "\\xff"
    assert records.show(b"x" * 5000, "text").endswith(" …")


def test_history_gives_rates_and_mean_latency_and_skips_a_counter_reset():
    h = History(keep_s=100)
    h.add(Totals(0.0, messages_in=0, produce_ms=0, produce_n=0))
    h.add(Totals(5.0, messages_in=50, bytes_in=500, produce_ms=20, produce_n=10))
    h.add(Totals(10.0, messages_in=10))                 # a frontend restarted: counters fell
    h.add(Totals(15.0, messages_in=60, produce_ms=5, produce_n=1))
    s = h.series()
    assert s["t"] == [5.0, 15.0]
    assert s["messages_in"] == [10.0, 10.0] and s["bytes_in"][0] == 100.0
    assert s["produce_ms"] == [2.0, 5.0] and s["fetch_ms"] == [None, None]
    h.add(Totals(200.0))
    assert [t.at for t in h.samples] == [200.0]           # older than keep_s is dropped


def test_group_lags_keep_an_hour_per_partition_and_the_total_of_the_most_watched_groups():
    g = GroupLags(keep_s=100, every_s=5, max_groups=2)
    g.add("readers", 0.0, {"orders-1": 3, "orders-0": 4})
    g.add("readers", 1.0, {"orders-1": 2, "orders-0": 4})    # too soon: replaces the point
    g.add("readers", 10.0, {"orders-10": 1, "orders-0": 0})   # a partition came, one went
    s = g.series("readers")
    assert s["t"] == [0.0, 10.0] and s["total"] == [6, 1]
    assert s["partitions"] == ["orders-0", "orders-1", "orders-10"]   # by number, not text
    assert s["lag"] == [[4, 0], [2, None], [None, 1]]
    g.add("readers", 200.0, {})
    assert g.series("readers")["t"] == [200.0]               # older than keep_s is dropped
    g.add("b", 0.0, {"t-0": 1})
    g.add("readers", 210.0, {})                               # watched again: the newest
    g.add("c", 0.0, {"t-0": 1})                               # the longest unwatched goes
    assert set(g.groups) == {"readers", "c"}
    assert g.series("unknown") == {"t": [], "total": [], "partitions": [], "lag": []}


def test_user_forms_are_checked_before_any_kafka_request_and_a_delete_needs_its_tick(tmp_path):
    c = _console(tmp_path, allow_changes=True)      # no broker here: a request would fail
    s = c.sessions.new(c.clock())
    base = {"csrf": s.csrf, "back": "/security", "name": "carol", "mechanism": "SCRAM-SHA-512"}
    for form, said in [({"password": "a", "password2": "b"}, "the two passwords differ"),
                       ({"password": "", "password2": ""}, "the password is empty"),
                       ({"mechanism": "PLAIN", "password": "a", "password2": "a"},
                        "the mechanism is one of SCRAM-SHA-256, SCRAM-SHA-512"),
                       ({"name": " ", "password": "a", "password2": "a"}, "name the user")]:
        r = c.handle(_request("POST", "/security/users/add", {**base, **form}, s.sid))
        assert r.status == 303 and ("Location", "/security") in r.headers
        kind, text = s.flash.pop()
        assert kind == "error" and text.endswith(said), text
    r = c.handle(_request("POST", "/security/users/delete", base, s.sid))
    kind, text = s.flash.pop()
    assert kind == "error" and text.endswith("not done: tick the box to confirm deleting carol")
    r = c.handle(_request("POST", "/security/users/add", {**base, "csrf": "forged"}, s.sid))
    assert r.status == 403


def test_share_groups_link_to_their_own_page(tmp_path):
    c = _console(tmp_path)
    s = c.sessions.new(c.clock())
    body = c.render(s, "groups.html", page="/groups", groups=[
        {"group": "sg", "group_type": "share", "protocol_type": "share", "state": "Stable"},
        {"group": "old", "group_type": None, "protocol_type": "share", "state": "Empty"},
        {"group": "cg", "group_type": "consumer", "protocol_type": "consumer", "state": "Stable"},
    ]).body.decode()
    assert 'href="/share-groups/sg"' in body and 'href="/share-groups/old"' in body
    assert 'href="/groups/cg"' in body
    body = c.render(s, "share_group.html", page="/groups", group={
        "group": "sg", "state": "Stable", "group_epoch": 3, "assignment_epoch": 3,
        "coordinator": 1, "members": [{"member_id": "m1", "client_id": "c", "host": "/h",
                                       "member_epoch": 3, "assignment": [("t", 0)]}],
        "offsets": [{"topic": "t", "partition": 0, "start": 7, "lag": 2, "members": ["m1"]}],
    }).body.decode()
    assert "<td>t-0</td><td>7</td><td class=\"lag\">2</td><td>m1</td>" in body


def test_a_share_group_reset_shows_its_dry_run_plan_and_checks_the_offset_first(tmp_path):
    c = _console(tmp_path, allow_changes=True)      # no broker here: a request would fail
    s = c.sessions.new(c.clock())
    r = c.handle(_request("POST", "/share-groups/sg/reset", {
        "csrf": s.csrf, "back": "/share-groups/sg", "topic": "t", "to": "offset",
        "offset": ""}, s.sid))
    assert r.status == 303 and ("Location", "/share-groups/sg") in r.headers
    kind, text = s.flash.pop()
    assert kind == "error" and text.endswith("offset must be a number"), text
    group = {"group": "sg", "state": "Empty", "group_epoch": 3, "assignment_epoch": 3,
             "coordinator": 1, "members": [],
             "offsets": [{"topic": "t", "partition": 0, "start": 7, "lag": 2, "members": []}]}
    body = c.render(s, "share_group.html", page="/groups", group=group, form={
        "topic": "t", "to": "latest"}, plan=[
        {"topic": "t", "partition": 0, "current": 7, "new": 9},
        {"topic": "t", "partition": 1, "current": None, "new": 4}]).body.decode()
    assert "<td>t-0</td><td>7</td><td>9</td>" in body and "<td>t-1</td><td>-</td><td>4</td>" in body
    assert "<option selected>latest</option>" in body and 'name="csrf"' in body
    # read-only: no form at all
    body = _console(tmp_path).render(s, "share_group.html", page="/groups", group=group,
                                     form={}, plan=None).body.decode()
    assert 'id="reset"' not in body


def test_problems_say_what_is_wrong_in_words():
    procs = [{"title": "frontend 0", "state": "down", "restarts": 4, "heartbeat_age": None},
             {"title": "coordinator", "state": "ready", "restarts": 0, "heartbeat_age": 9.0},
             {"title": "fetcher 0", "state": "ready", "restarts": 1, "heartbeat_age": 0.1}]
    out = problems(procs, {"total": 100, "used": 99, "free": 1, "reserve": 1}, 5)
    assert out[0].startswith("the disk is full")
    assert "frontend 0 is down (the supervisor restarts it)" in out
    assert "frontend 0 restarted 4 times: near a crash loop" in out
    assert any(p.startswith("coordinator has not beaten its heartbeat") for p in out)
    assert "fetcher 0 restarted 1 time" in out
    assert problems([], {"total": 100, "used": 10, "free": 90, "reserve": 1}, 5) == []


def test_the_acl_form_takes_kafkas_names():
    b = parse_acl({"resource_type": "Topic", "resource_name": "orders", "pattern": "Literal",
                   "principal": "User:alice", "host": "*", "operation": "Read",
                   "permission": "Allow"})
    assert str(b) == ("(principal=User:alice, host=*, operation=Read, permissionType=Allow) on "
                      "Topic:LITERAL:orders")
    b = parse_acl({"resource_type": "Cluster", "principal": "User:a", "operation": "ClusterAction"})
    assert b.resource_name == "kafka-cluster"
    for bad in ({"resource_type": "User", "resource_name": "x", "principal": "User:a",
                 "operation": "Read"},
                {"resource_type": "Topic", "resource_name": "x", "principal": "alice",
                 "operation": "Read"},
                {"resource_type": "Topic", "resource_name": "", "principal": "User:a",
                 "operation": "Read"}):
        with pytest.raises(ValueError):
            parse_acl(bad)


def test_console_config_is_checked():
    with pytest.raises(ConfigError, match="console.listen: must differ"):
        load(None, environ={}, overrides={"server": {"listen": "127.0.0.1:9092"},
                                          "console": {"listen": "127.0.0.1:9092"}})
    with pytest.raises(ConfigError, match="console.listen: must differ from metrics.listen"):
        load(None, environ={}, overrides={"metrics": {"listen": "127.0.0.1:9404"},
                                          "console": {"listen": "127.0.0.1:9404"}})
    with pytest.raises(ConfigError, match="console.tls: needs tls.cert_file"):
        load(None, environ={}, overrides={"console": {"listen": "127.0.0.1:9480", "tls": True}})
    assert load(None, environ={}, overrides={"console": {"listen": "127.0.0.1:9480"}}
                ).console.listen == "127.0.0.1:9480"


def test_the_consoles_own_tls_connections_take_its_ca_and_client_certificate(tmp_path):
    tls = {"cert_file": "/b.pem", "key_file": "/b.key", "ca_file": "/clients-ca.pem",
           "client_auth": "required"}
    ssl_only = {"listeners": "SSL://127.0.0.1:9093"}
    with pytest.raises(ConfigError, match="console.ssl_certfile: required: the console connects "
                                          "to the SSL listener"):
        load(None, environ={}, overrides={"server": ssl_only, "tls": tls,
                                          "console": {"listen": "127.0.0.1:9480"}})
    with pytest.raises(ConfigError, match="give both or neither"):
        load(None, environ={}, overrides={"server": ssl_only, "tls": tls, "console": {
            "listen": "127.0.0.1:9480", "ssl_certfile": "/c.pem"}})
    # a plaintext listener beside it: the console uses that one and needs no certificate
    load(None, environ={}, overrides={"server": {"listeners": "SSL://127.0.0.1:9093,"
                                                              "PLAINTEXT://127.0.0.1:9092"},
                                      "tls": tls, "console": {"listen": "127.0.0.1:9480"}})
    cfg = load(None, environ={}, overrides={"server": ssl_only, "tls": tls, "console": {
        "listen": "127.0.0.1:9480", "ssl_cafile": "/brokers-ca.pem", "ssl_certfile": "/c.pem",
        "ssl_keyfile": "/c.key"}})
    target = pick_target(cfg, {"SSL": 9093})
    sec = Console(cfg, str(tmp_path), str(tmp_path), target).security()
    assert (target.listener.protocol, sec.ssl_cafile, sec.ssl_certfile, sec.ssl_keyfile) == (
        "SSL", "/brokers-ca.pem", "/c.pem", "/c.key")
    # without [console] ssl_cafile: [tls]'s CA file, as before
    cfg = load(None, environ={}, overrides={"server": ssl_only, "tls": {**tls, "client_auth": "none"},
                                            "console": {"listen": "127.0.0.1:9480"}})
    sec = Console(cfg, str(tmp_path), str(tmp_path), pick_target(cfg, {"SSL": 9093})).security()
    assert (sec.ssl_cafile, sec.ssl_certfile) == ("/clients-ca.pem", None)
