"""Per-filter routing (`filters route`): a filter's matches through a channel of its own,
signed with its own secret, and in a mode of its own (instant, digest), while the user's
other filters keep the user's; digests go one per destination."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import sqlalchemy as sa

from pipeline.catalogue import users
from pipeline.notify.delivery import verify
from pipeline.notify.notifier import NotifyStats
from pipeline.storage import schema
from tests.test_cli import assert_one_line_error, run
from tests.test_notifier import SECRET, add_listing, add_user, notifications, notifier, posts

FILTER_SECRET = "the-python-filter-secret-42"


@pytest.fixture
def receiver(receiver):
    """The webhook receiver, answering 204 on each destination these tests use."""
    for path in ("/alice", "/bob", "/python", "/go"):
        receiver.routes[path] = lambda h: h.reply(204)
    return receiver


@pytest.fixture
def source_id(engine):
    from tests.helpers import add_source

    with engine.begin() as conn:
        return add_source(conn, "http://127.0.0.1/feed")


def told(receiver) -> list[tuple[str, tuple[str, ...]]]:
    """(path, titles) of each delivery, a digest's titles together."""
    found = []
    for post in posts(receiver):
        body = json.loads(post["body"])
        items = body["items"] if "items" in body else [body]
        found.append((post["path"], tuple(sorted(i["listing"]["title"] for i in items))))
    return found


def test_a_routed_filter_s_matches_go_through_its_own_channel_signed_with_its_own_secret(engine, receiver, source_id):
    with engine.begin() as conn:
        add_user(conn, "alice", receiver.url("/alice"))
        python = users.add_filter(conn, "alice", "python")
        users.add_filter(conn, "alice", "rust")
        users.route_filter(conn, python, webhook=receiver.url("/python"), secret=FILTER_SECRET)
        add_listing(conn, source_id, "a", "Python developer")
        add_listing(conn, source_id, "b", "Rust developer")
        add_listing(conn, source_id, "c", "Python and Rust")  # both: the older filter (python) is named
    assert notifier(engine).run().sent == 3
    assert sorted(told(receiver)) == [("/alice", ("Rust developer",)), ("/python", ("Python and Rust",)),
                                      ("/python", ("Python developer",))]
    for post in posts(receiver):
        own = post["path"] == "/python"
        assert verify(FILTER_SECRET if own else SECRET, post["body"], post["headers"])
        assert not verify(SECRET if own else FILTER_SECRET, post["body"], post["headers"]), "each its own key"
    assert {n["channel"] for n in notifications(engine)} == {"webhook"}

    with engine.begin() as conn:  # back to the user's channel: what comes next goes there
        users.route_filter(conn, python, user_channel=True)
        add_listing(conn, source_id, "d", "Python lead")
    assert notifier(engine).run().sent == 1
    assert told(receiver)[-1] == ("/alice", ("Python lead",))


def test_a_filter_s_mode_overrides_the_user_s_digest_and_digests_go_one_per_destination(engine, receiver, source_id):
    with engine.begin() as conn:
        add_user(conn, "alice", receiver.url("/alice"))
        users.set_delivery(conn, "alice", digest="daily@08:00")
        urgent = users.add_filter(conn, "alice", "urgent")
        users.add_filter(conn, "alice", "rust")
        go = users.add_filter(conn, "alice", "go")
        users.route_filter(conn, urgent, mode="instant")
        users.route_filter(conn, go, webhook=receiver.url("/go"), secret=FILTER_SECRET)
        for item, title in (("u", "Urgent: on call"), ("r1", "Rust job"), ("r2", "Rust lead"), ("g", "Go job")):
            add_listing(conn, source_id, item, title)
        add_user(conn, "bob", receiver.url("/bob"))  # no digest; his filter asks for one
        users.route_filter(conn, users.add_filter(conn, "bob", "rust"), mode="digest")
    stats = notifier(engine).run()
    assert (stats.notifications_created, stats.sent) == (6, 1)
    assert told(receiver) == [("/alice", ("Urgent: on call",))], "instant, though alice gets a daily digest"
    held = [n for n in notifications(engine) if n["status"] == "held"]
    assert len(held) == 5
    release = max(n["next_attempt_at"] for n in held)

    late = notifier(engine)
    late.make_digests(stats := NotifyStats(), now=release + timedelta(seconds=1))
    late.deliver(stats)
    assert stats.digests_made == stats.digests_sent == 3
    assert sorted(told(receiver)[1:]) == [("/alice", ("Rust job", "Rust lead")), ("/bob", ("Rust job", "Rust lead")),
                                          ("/go", ("Go job",))], "alice's two destinations, one digest each"
    go_digest = next(p for p in posts(receiver) if p["path"] == "/go")
    assert verify(FILTER_SECRET, go_digest["body"], go_digest["headers"])


def test_filters_route_on_the_command_line(engine, db_url):
    env = {"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}
    with engine.begin() as conn:
        users.add_user(conn, "alice", webhook="http://127.0.0.1:9/hook", secret=SECRET)
        filter_id = users.add_filter(conn, "alice", "python")
    routed = run("filters", "route", str(filter_id), "--webhook", "http://127.0.0.1:9/python/TOKEN123456",
                 "--mode", "instant", env=env)
    assert routed.returncode == 0, routed
    assert "webhook secret (shown once" in routed.stderr
    listed = run("filters", "list", env=env).stdout
    assert "python to webhook http://127.0.0.1/… (instant)" in listed and "TOKEN" not in listed
    with engine.connect() as conn:
        row = conn.execute(sa.select(schema.filters.c.secret, schema.filters.c.mode)).one()
    assert len(row.secret) >= 32 and row.mode == "instant"
    for args, said in (
        (["--webhook", "http://10.0.0.1/x"], "which the address guard refuses"),
        (["--webhook", "http://127.0.0.1:9/x", "--apprise", "json://127.0.0.1:9/x"], "give one channel"),
        ([], "give a channel (--webhook, --apprise, --user-channel) or a --mode"),
        (["--apprise", "nonsense://"], "is not a URL Apprise can send to"),
    ):
        assert_one_line_error(run("filters", "route", str(filter_id), *args, env=env), said)
    assert_one_line_error(run("filters", "route", "999", "--mode", "user", env=env), "no filter with id 999")
    back = run("filters", "route", str(filter_id), "--user-channel", "--mode", "user", env=env)
    assert back.returncode == 0 and run("filters", "list", env=env).stdout.rstrip().endswith("python")
