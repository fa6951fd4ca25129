"""The appliance console (issue 38) in a real browser: Debian's chromium driven by Playwright,
against one real appliance for the module (a SASL_PLAINTEXT listener, SCRAM users, the ACL
authorizer on, KIP-939 two-phase commit allowed, the console on HTTPS with the [tls] certificate).

What a person does: logs in (a wrong password refused), sees the Overview (processes, charts),
creates a topic, produces to it with a real client (confluent-kafka), browses the records as text
and JSON with an aborted transaction and its marker marked, watches a group's lag fall, sees a
prepared KIP-939 transaction pin the LSO and force-terminates it, and a user without ACLs is
refused a change. The group's lag chart draws the points the console kept; a share group
(confluent-kafka's ShareConsumer) has its page with its member and share partition; a SCRAM user
is added (and can authenticate), then deleted, and a user without Alter on the cluster is refused. The session cookie's flags, the CSRF check and the supervisor's restart of a
killed console are checked too.

``APPLIANCE_CONSOLE_SCREENSHOTS=1`` writes a screenshot of each page into docs/console/ (README
shows them).
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, ShareConsumer, TopicPartition
from playwright import sync_api as playwright_api

from appliance.client import Producer as ApplianceProducer
from appliance.client.admin import AdminClient
from appliance.cli.user_admin import add_offline
from appliance.client.security import DEFAULTS, Security
from appliance_harness import Appliance, free_port
from security_setup import make_pki

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "docs" / "console"
CHROMIUM = "/usr/bin/chromium"
USERS = {"admin": "admin-secret", "alice": "alice-secret"}
TIMEOUT_MS = 15000


def _security(user: str) -> Security:
    return Security.from_config({**DEFAULTS, "security_protocol": "SASL_PLAINTEXT",
                                 "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": user,
                                 "sasl_password": USERS[user]})


def _confluent(app, user: str = "admin", **extra) -> dict:
    return {"bootstrap.servers": app.bootstrap, "security.protocol": "sasl_plaintext",
            "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": user,
            "sasl.password": USERS[user], **extra}


def _get(url: str) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
            return r.status
    except OSError:
        return 0


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: make install-test installs Debian's chromium")
    d = tmp_path_factory.mktemp("console")
    pki = make_pki(str(d / "pki"))
    data = str(d / "data")
    # offline, as `appliance users add` does, in this process (a subprocess each costs seconds)
    for user, password in USERS.items():
        for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            add_offline(data, user, mech, password, 4096)
    sasl_port, console_port = free_port(), free_port()
    app = Appliance(data_dir=data, log_path=str(d / "appliance.log"), config={
        "server": {"listeners": f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}"},
        "sasl": {"mechanisms": ["SCRAM-SHA-512", "SCRAM-SHA-256"]},
        "tls": {"cert_file": pki.broker_cert, "key_file": pki.broker_key, "ca_file": pki.ca},
        "authorizer": {"enable": True, "super_users": ["User:admin"]},
        "transactions": {"two_phase_commit_enable": True},
        "groups": {"initial_rebalance_delay_ms": 0, "share_auto_offset_reset": "earliest",
                   "share_heartbeat_interval_ms": 500},
        "console": {"listen": f"127.0.0.1:{console_port}", "tls": True}})
    app.use_listeners({"SASL_PLAINTEXT": sasl_port})
    app.start()
    base = f"https://127.0.0.1:{console_port}"
    app.wait_for(lambda: _get(base + "/login") == 200, what="the console to serve")
    pw = playwright_api.sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    try:
        yield app, browser, base
    finally:
        browser.close()
        pw.stop()
        app.terminate()


def _page(console, user: str | None = "admin"):
    """A fresh browser context (its own cookies), logged in as ``user``."""
    app, browser, base = console
    ctx = browser.new_context(ignore_https_errors=True, base_url=base,
                              viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    page = ctx.new_page()
    if user:
        page.goto("/login")
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", USERS[user])
        page.click("button[type=submit]")
        page.wait_for_url(base + "/")
    return page


@pytest.fixture(scope="module")
def admin_page(console):
    """One logged-in admin page for the module's tests (a login costs two SCRAM exchanges)."""
    page = _page(console)
    yield page
    page.context.close()


def shot(page, name: str) -> None:
    if os.environ.get("APPLIANCE_CONSOLE_SCREENSHOTS"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _flash(page):
    return page.locator("p.flash")


def test_login_refuses_a_wrong_password_and_the_overview_shows_the_processes(console):
    app, _, base = console
    expect = playwright_api.expect
    page = _page(console, user=None)
    page.goto("/topics")
    page.wait_for_url(f"{base}/login?next=/topics")       # every page needs a login
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "not-the-password")
    page.click("button[type=submit]")
    expect(page.locator("[role=alert]")).to_have_text("wrong user name or password")
    shot(page, "login")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", USERS["admin"])
    page.click("button[type=submit]")
    page.wait_for_url(base + "/topics")
    cookie, = [c for c in page.context.cookies() if c["name"] == "appliance_console"]
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict", cookie
    headers = page.request.get(base + "/topics").headers     # the worker's headers on every answer
    assert headers["x-frame-options"] == "DENY" and headers["cache-control"] == "no-store", headers
    page.goto("/")
    expect(page.locator("header .who")).to_have_text("User:admin")
    rows = page.locator("#processes tbody tr")
    roles = {r.split("\t")[0] for r in rows.evaluate_all("rs => rs.map(r => r.innerText)")}
    assert {"supervisor", "coordinator", "frontend 0", "console"} <= roles, roles
    expect(page.locator("p.allgood")).to_be_visible()
    # the charts library (vendored, served by the console itself) drew its charts
    expect(page.locator("#chart-records .uplot canvas")).to_have_count(1)
    shot(page, "overview")
    page.context.close()


def test_create_produce_browse_and_group_lag(console, admin_page):
    app, _, base = console
    expect = playwright_api.expect
    page = admin_page
    page.goto("/topics")
    page.fill("#create-topic input[name=name]", "orders")
    page.fill("#create-topic input[name=partitions]", "2")
    page.fill("#create-topic textarea[name=configs]", "retention.ms=86400000")
    page.click("#create-topic button")
    expect(_flash(page)).to_have_text("created topic orders")
    expect(page.locator("#topics")).to_contain_text("orders")
    # a real client produces: three plain records, then an aborted transaction
    p = Producer(_confluent(app))
    for i in range(3):
        p.produce("orders", key=b"k%d" % i, value=json.dumps({"n": i}).encode(), partition=0,
                  headers=[("source", b"test")])
    assert p.flush(30) == 0
    t = Producer(_confluent(app, **{"transactional.id": "console-aborts"}))
    t.init_transactions(30)
    t.begin_transaction()
    t.produce("orders", value=b"never seen", partition=0)
    assert t.flush(30) == 0             # an abort purges what is not yet sent
    t.abort_transaction(30)
    page.goto("/topics/orders")
    expect(page.locator("#configs")).to_contain_text("DYNAMIC_TOPIC_CONFIG")
    expect(page.locator("#partitions tbody tr").first).to_contain_text("5")   # 3 + 1 + marker
    shot(page, "topic")
    page.goto("/topics/orders/records?partition=0&format=json")
    records = page.locator("#records tbody tr")
    expect(records).to_have_count(5)
    expect(records.nth(0)).to_contain_text('"n": 0')
    expect(records.nth(0)).to_contain_text("source")
    expect(page.locator("#records tr.mark-aborted")).to_contain_text("never seen")
    expect(page.locator("#records tr.control")).to_contain_text("ABORT marker")
    shot(page, "records")
    page.select_option("select[name=isolation]", "read_committed")
    page.select_option("select[name=format]", "hex")
    page.click("#browse button")
    expect(page.locator(".aborted-list")).to_contain_text("Aborted transactions")
    expect(records.nth(0)).to_contain_text("7b 22 6e 22")       # {"n" in hex
    # a group's lag falls as its consumer commits
    c = Consumer(_confluent(app, **{"group.id": "readers", "enable.auto.commit": False}))
    try:
        c.commit(offsets=[TopicPartition("orders", 0, 1)], asynchronous=False)
        page.goto("/groups/readers")
        expect(page.locator("#lag td.lag")).to_have_text("4")
        if os.environ.get("APPLIANCE_CONSOLE_SCREENSHOTS"):
            # screenshots only: a falling line, the chart's refresh taking a point every 5 s
            for points, offset in ((2, 3), (3, 5)):
                _wait_points(app, page, "#chart-lag", points)
                c.commit(offsets=[TopicPartition("orders", 0, offset)], asynchronous=False)
        c.commit(offsets=[TopicPartition("orders", 0, 5)], asynchronous=False)
        page.reload()
        expect(page.locator("#lag td.lag")).to_have_text("0")
        # the lag chart (uPlot), its points kept by the console: the page's read, then the
        # chart's own refresh, each a point of the total and of orders-0
        expect(page.locator("#chart-lag .uplot canvas")).to_have_count(1)
        expect(page.locator("#chart-lag")).to_have_attribute("data-points", re.compile(r"^[1-9]"))
        lag = page.request.get(base + "/api/groups/readers/lag").json()
        assert lag["partitions"] == ["orders-0"] and lag["total"][-1] == 0, lag
        assert lag["lag"][0][-1] == 0 and len(lag["t"]) == len(lag["total"]) >= 1, lag
        _check_time_axis(page, "#chart-lag")
        shot(page, "group")
        # reset offsets: the dry run shows the plan and changes nothing
        page.fill("#reset input[name=topic]", "orders")
        page.select_option("#reset select[name=to]", "earliest")
        page.click("#reset button")
        expect(page.locator("#plan")).to_contain_text("orders-0")
        with AdminClient(app.bootstrap, security=_security("admin")) as a:
            assert a.committed_offsets("readers")[("orders", 0)] == 5
    finally:
        c.close()


def _wait_points(app, page, chart: str, n: int, timeout: float = 30) -> None:
    """Until ``chart`` has drawn ``n`` points (polled from here: the console's CSP has no
    unsafe-eval, so Playwright's wait_for_function with an expression cannot run there)."""
    el = page.locator(chart)
    app.wait_for(lambda: int(el.get_attribute("data-points") or 0) >= n, timeout=timeout,
                 what=f"{n} points in {chart}")


def _check_time_axis(page, chart: str) -> None:
    """The chart's x scale spans the hour around a lone point, else its points' span: never the
    years uPlot gives a time scale with one value (regression: the lag chart of a group just
    opened, one point, had an axis of 1,000 days)."""
    el = page.locator(chart)
    playwright_api.expect(el).to_have_attribute("data-xspan", re.compile(r"."))
    points, span = el.evaluate("e => [Number(e.dataset.points), Number(e.dataset.xspan)]")
    if points == 1:
        assert span == 3600, (chart, points, span)
    else:
        assert 0 < span <= 3600 + 5, (chart, points, span)


def test_a_prepared_transaction_pins_the_lso_until_force_terminated(console, admin_page):
    app, _, base = console
    expect = playwright_api.expect
    with AdminClient(app.bootstrap, security=_security("admin")) as a:
        assert a.create_topics([{"name": "ledger", "partitions": 1}])["ledger"][0] == 0
    p = ApplianceProducer(bootstrap_servers=app.bootstrap, transactional_id="ledger-2pc",
                          enable_two_phase_commit=True, security_protocol="SASL_PLAINTEXT",
                          sasl_mechanism="SCRAM-SHA-512", sasl_username="admin",
                          sasl_password=USERS["admin"])
    try:
        p.init_transactions()
        p.begin_transaction()
        for i in range(3):
            p.send("ledger", b"prepared-%d" % i, partition=0)
        p.prepare_transaction()
        page = admin_page
        page.goto("/transactions")
        row = page.locator("#txn-ledger-2pc")
        expect(row).to_contain_text("Ongoing")
        expect(row.locator(".pinned")).to_contain_text("pins the LSO at 0")
        shot(page, "transactions")
        page.goto("/topics/ledger")
        expect(page.locator("#partitions td.pinned")).to_contain_text("0 (pinned 3 behind)")
        page.goto("/transactions")
        # the confirmation is required: without it, nothing is done
        row.locator("input[name=confirm]").evaluate("e => e.removeAttribute('required')")
        row.locator("button").click()
        expect(_flash(page)).to_contain_text("tick the box to confirm")
        expect(row).to_contain_text("Ongoing")
        row.locator("input[name=confirm]").check()
        row.locator("button").click()
        expect(_flash(page)).to_contain_text("terminated ledger-2pc")
        # aborted, and the id is free again (Empty once the new producer id is handed out)
        expect(row.locator("td").nth(2)).to_have_text(re.compile("CompleteAbort|Empty"))
        with AdminClient(app.bootstrap, security=_security("admin")) as a:
            def lso():
                return a.list_offsets({("ledger", 0): -1}, isolation_level=1)[("ledger", 0)][1]
            app.wait_for(lambda: lso() == 4, what="the LSO past the abort marker")
    finally:
        try:
            p.close()
        except Exception:
            pass                        # fenced by the force-terminate: its close may say so


def test_a_user_without_acls_is_refused_and_a_form_without_its_csrf_token(console, admin_page):
    app, _, base = console
    expect = playwright_api.expect
    page = _page(console, "alice")
    page.goto("/topics")
    page.fill("#create-topic input[name=name]", "alices")
    page.fill("#create-topic input[name=partitions]", "1")
    page.click("#create-topic button")
    expect(_flash(page)).to_contain_text("AUTHORIZATION_FAILED")
    shot(page, "refused")
    # a POST without the session's CSRF token is refused before anything is done
    r = page.request.post(base + "/topics/create", form={"name": "forged", "partitions": "1"},
                          max_redirects=0)
    assert r.status == 403 and "CSRF" in r.text()
    admin = admin_page
    r = admin.request.post(base + "/topics/create",
                           form={"name": "forged", "partitions": "1", "csrf": "wrong"},
                           max_redirects=0)
    assert r.status == 403
    with AdminClient(app.bootstrap, security=_security("admin")) as a:
        names = a.list_topics()
        assert "alices" not in names and "forged" not in names
        assert a.create_topics([{"name": "shared", "partitions": 1}])["shared"][0] == 0
    admin.goto("/security")
    expect(admin.locator("#users")).to_contain_text("alice")
    expect(admin.locator("#users")).to_contain_text("SCRAM-SHA-256, SCRAM-SHA-512")
    admin.fill("#add-acl input[name=principal]", "User:alice")
    admin.select_option("#add-acl select[name=operation]", "Describe")
    admin.fill("#add-acl input[name=resource_name]", "shared")
    admin.click("#add-acl button")
    expect(_flash(admin)).to_contain_text("added")
    expect(admin.locator("#acls")).to_contain_text("principal=User:alice")
    shot(admin, "security")
    # alice may describe it now, once the frontends have the new ACL (they learn it from the
    # supervisor's page: the reload is the look again)
    page.goto("/topics")
    app.wait_for(lambda: "shared" in (page.reload(), page.locator("#topics").inner_text())[1],
                 what="alice to see the topic her new ACL lets her describe")
    if os.environ.get("APPLIANCE_CONSOLE_SCREENSHOTS"):
        # the Overview again once its charts have points (a sample every 5 s): screenshots only
        admin.goto("/")
        _wait_points(app, admin, "#chart-records", 3, timeout=60)
        shot(admin, "overview")
    page.context.close()


def test_a_share_group_shows_its_members_and_share_partitions(console, admin_page):
    app, _, base = console
    expect = playwright_api.expect
    page = admin_page
    with AdminClient(app.bootstrap, security=_security("admin")) as a:
        assert a.create_topics([{"name": "jobs", "partitions": 1}])["jobs"][0] == 0
    p = Producer(_confluent(app))
    p.produce("jobs", value=b"job 1")
    assert p.flush(30) == 0
    sc = ShareConsumer(_confluent(app, **{"group.id": "sharers"}))
    try:
        sc.subscribe(["jobs"])
        app.wait_for(lambda: any(not m.error() for m in sc.poll(0.5) or ()),
                     what="the share consumer to get the record of jobs")
        page.goto("/groups")
        page.click("#groups a:text-is('sharers')")
        page.wait_for_url(base + "/share-groups/sharers")
        expect(page.locator("#members tbody tr")).to_have_count(1)
        expect(page.locator("#members")).to_contain_text("jobs-0")
        row = page.locator("#share-offsets tbody tr")
        expect(row).to_have_count(1)
        expect(row.locator("td").nth(0)).to_have_text("jobs-0")
        # acquired, not yet acknowledged (an implicit acknowledgement comes with the next poll)
        expect(row.locator("td").nth(1)).to_have_text("0")
        expect(row.locator("td").nth(2)).to_have_text("1")
        # a reset while the consumer is a member: the dry run plans it, the broker refuses it
        page.fill("#reset input[name=topic]", "jobs")
        page.select_option("#reset select[name=to]", "latest")
        page.click("#reset button")
        expect(page.locator("#plan tbody tr td")).to_have_text(["jobs-0", "0", "1"])
        shot(page, "share-group")
        page.check("#reset input[name=execute]")        # the form kept the dry run's choices
        page.click("#reset button")
        expect(_flash(page)).to_contain_text("NON_EMPTY_GROUP")
    finally:
        sc.close()
    with AdminClient(app.bootstrap, security=_security("admin")) as a:
        app.wait_for(lambda: not a.describe_share_group("sharers")["members"],
                     what="the closed share consumer to leave sharers")
        assert a.share_offsets("sharers")[("jobs", 0)][0] == 0     # neither run changed it
        page.goto("/share-groups/sharers")
        page.fill("#reset input[name=topic]", "jobs")
        page.select_option("#reset select[name=to]", "latest")
        page.check("#reset input[name=execute]")
        page.click("#reset button")
        expect(_flash(page)).to_have_text(
            "reset the start offsets of share group sharers on jobs to the latest")
        expect(row.locator("td").nth(1)).to_have_text("1")
        assert a.share_offsets("sharers")[("jobs", 0)][0] == 1


def test_the_overview_charts_time_axis_spans_at_most_the_hour_kept(console, admin_page):
    page = admin_page
    page.goto("/")
    # a point every 5 s since the console started (the earlier tests took longer than that)
    _wait_points(console[0], page, "#chart-records", 1)
    for chart in ("#chart-records", "#chart-bytes", "#chart-latency"):
        _check_time_axis(page, chart)


def test_users_are_added_and_deleted_as_the_logged_in_principal(console, admin_page):
    app, _, base = console
    expect = playwright_api.expect
    alice = _page(console, "alice")
    # a share group's reset, as alice: refused by the authorizer (no Read on the group), with
    # her session's CSRF token (she sees no reset form: the group's page is refused to her)
    alice.goto("/topics")
    token = alice.locator("input[name=csrf]").first.get_attribute("value")
    alice.request.post(base + "/share-groups/sharers/reset", form={
        "csrf": token, "topic": "jobs", "to": "latest", "execute": "yes"}, max_redirects=0)
    alice.reload()
    expect(_flash(alice)).to_contain_text("GROUP_AUTHORIZATION_FAILED")
    alice.goto("/security")
    alice.fill("#add-user input[name=name]", "mallory")
    alice.fill("#add-user input[name=password]", "m-secret")
    alice.fill("#add-user input[name=password2]", "m-secret")
    alice.click("#add-user button")
    # refused by the authorizer: alice has no Alter on the cluster
    expect(alice.locator("p.flash[role=status]")).to_have_text(
        "CLUSTER_AUTHORIZATION_FAILED (31): user mallory")
    alice.context.close()
    admin = admin_page
    admin.goto("/security")
    admin.fill("#add-user input[name=name]", "carol")
    admin.select_option("#add-user select[name=mechanism]", "SCRAM-SHA-256")
    admin.fill("#add-user input[name=password]", "carol-secret")
    admin.fill("#add-user input[name=password2]", "carol-secret")
    admin.click("#add-user button")
    expect(_flash(admin)).to_have_text("user carol: SCRAM-SHA-256 credential set")
    row = admin.locator("#users tr", has_text="carol")
    expect(row).to_contain_text("SCRAM-SHA-256")
    assert "mallory" not in admin.locator("#users").inner_text()
    # carol's credential works over the Kafka protocol
    with AdminClient(app.bootstrap, security=Security.from_config({
            **DEFAULTS, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_username": "carol", "sasl_password": "carol-secret"})) as a:
        a.list_topics()
    row.locator("input[name=confirm]").check()
    row.locator("button").click()
    expect(_flash(admin)).to_have_text("user carol: deleted SCRAM-SHA-256")
    expect(admin.locator("#users")).not_to_contain_text("carol")


def test_spark_jobs_a_dead_job_is_recovered(console, admin_page):
    from appliance.spark import jobs
    app, _, base = console
    expect = playwright_api.expect
    page = admin_page
    page.goto("/spark")
    expect(page.locator("main")).to_contain_text("No job log yet")
    # a batch job whose driver died before it decided (its timeout long past): the job log's
    # records as the sink writes them
    cfg = {"bootstrap_servers": app.bootstrap, "security_protocol": "SASL_PLAINTEXT",
           "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "admin",
           "sasl_password": USERS["admin"]}
    with jobs.JobLog(cfg) as jl:
        jl.append("begin", "etl", "nightly", timeout_ms=1)
    page.reload()
    row = page.locator("#spark-jobs tbody tr")
    expect(row).to_contain_text("needs recovery")
    page.locator("#recover input[name=confirm]").check()
    page.click("#recover button")
    expect(page.locator("p.flash.ok")).to_contain_text("etl batch job nightly: rolled back")
    expect(row).to_contain_text(jobs.ABORTED)
    shot(page, "spark")


def test_the_supervisor_restarts_a_killed_console(console):
    app, _, base = console
    (w,) = app.workers("console")
    os.kill(w["pid"], signal.SIGKILL)
    app.wait_for(lambda: [x["pid"] for x in app.workers("console")] not in ([w["pid"]], [None])
                 and _get(base + "/login") == 200, what="a new console")
    page = _page(console)           # sessions were the dead console's: log in again
    playwright_api.expect(page.locator("#processes")).to_contain_text("console")
    page.context.close()
