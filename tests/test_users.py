"""Users, filters and notifications from the command line: validation and clear errors."""

from __future__ import annotations

import json
import re

import pytest
import sqlalchemy as sa

from pipeline.storage import schema
from tests.test_cli import assert_one_line_error, run


def test_users_and_filters_from_the_command_line(engine, db_url):
    env = {"DATABASE_URL": db_url}
    added = run("users", "add", "alice", "--webhook", "https://hooks.example/alice", env=env)
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == "1" and "webhook secret (shown once" in added.stderr
    generated = added.stderr.rsplit(": ", 1)[1].strip()
    assert run("users", "add", "bob", "--apprise", "slack://TokenA/TokenB/TokenC", env=env).returncode == 0
    assert run("filters", "add", "alice", "--keywords", "Python, remote", "--category", "jobs", env=env).stdout.strip() == "1"
    with engine.connect() as conn:
        secret = conn.execute(sa.select(schema.users.c.secret).where(schema.users.c.name == "alice")).scalar()
        keywords = conn.execute(sa.select(schema.filters.c.keywords)).scalar()
    assert secret == generated and keywords == ["python", "remote"]
    listed = run("users", "list", "--json", env=env).stdout
    assert "TokenA" not in listed and generated not in listed, "no secret is ever listed"
    assert json.loads(listed)[1]["target"] == "slack://…", "a Slack URL's host is its first token"
    assert "Python, remote category 'jobs'" in run("filters", "list", env=env).stdout


# Validation happens before any write: one database is enough to prove the message.
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["users", "add", "x"], "give exactly one channel"),
        (["users", "add", "x", "--webhook", "ftp://h/x"], "is not an http(s) URL"),
        (["users", "add", "x", "--apprise", "nonsense://"], "is not a URL Apprise can send to"),
        (["filters", "add", "nobody", "--keywords", "python"], "no user named (or with id) 'nobody'"),
        (["notifications", "requeue"], "name notifications with --id"),
        (["users", "add", "x", "--webhook", "http://[::1"], "webhook … is not a usable URL: Invalid IPv6 URL"),
        (["users", "add", "x", "--webhook", "http://h:99999/"], "is not a usable URL: Port out of range"),
        (["users", "add", "x", "--apprise", "json://[::1"], "Apprise URL … is not a usable URL: Invalid IPv6 URL"),
        (["filters", "add", str(2**63), "--keywords", "python"], f"no user named (or with id) '{2**63}'"),
        # Channels the address guard would refuse at every send are refused when added.
        (["users", "add", "x", "--webhook", "http://10.0.0.1/hook"],
         "webhook http://10.0.0.1/… sends to 10.0.0.1, which the address guard refuses"),
        (["users", "add", "x", "--webhook", "http://localhost:8080/hook"], "which the address guard refuses"),
        (["users", "add", "x", "--webhook", "http://[::ffff:169.254.169.254]/"], "which the address guard refuses"),
        (["users", "add", "x", "--apprise", "json://192.168.1.1/hook"], "sends to 192.168.1.1, which the address"),
        # Apprise splits at spaces and commas: the guard read the first host, the sends
        # went to all three (a TCP connection and a datagram to loopback).
        (["users", "add", "x", "--apprise", "json://x.invalid/ irc://127.0.0.1:6667/#c rsyslog://127.0.0.1:514"],
         "holds 3 Apprise URLs: a channel is one URL"),
        (["users", "add", "x", "--apprise", "json://hooks.example/a,json://127.0.0.1/b"], "holds 2 Apprise URLs"),
        # A C1 control (NEL ends a line where Python splits lines): once quoted in a two-line error.
        (["users", "add", "x", "--apprise", "HTTP://\x850"], "the Apprise URL contains a control character"),
        (["users", "add", "x\u2028y", "--webhook", "https://hooks.example/x"], "contains a control character"),
    ],
)
def test_bad_input_is_one_clear_line(engine, db_url, args, fragment):
    assert_one_line_error(run(*args, env={"DATABASE_URL": db_url}), fragment)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_allow_list_lets_an_operator_permit_a_network_for_channels(engine, db_url):
    env = {"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "10.0.0.0/8,127.0.0.1/32"}
    assert run("users", "add", "x", "--webhook", "http://10.0.0.1/hook", env=env).returncode == 0
    assert run("users", "add", "y", "--apprise", "json://127.0.0.1:9/hook", env=env).returncode == 0
    assert run("users", "add", "z", "--webhook", "https://hooks.example/z", env={"DATABASE_URL": db_url}).returncode == 0


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_bad_filters_name_what_is_wrong(engine, db_url):
    env = {"DATABASE_URL": db_url}
    run("users", "add", "alice", "--webhook", "https://hooks.example/a", env=env)
    assert_one_line_error(run("filters", "add", "alice", "--keywords", "big data!", env=env),
                          "filter 'big data!': at position 5: 'data!' is not a word")
    assert_one_line_error(run("filters", "add", "alice", "--query", '"data engineer" (remote OR', env=env),
                          "at position 27: OR needs a condition after it")
    assert_one_line_error(run("filters", "add", "alice", "--query", 'python source:"Nowhere Jobs"', env=env),
                          "at position 8: no source named (or with id) 'nowhere jobs'")
    assert_one_line_error(run("filters", "add", "alice", "--query", "python source:42", env=env),
                          "no source named (or with id) '42'")
    assert_one_line_error(run("filters", "add", "alice", "--query", f"python source:{2**63}", env=env),
                          f"no source named (or with id) '{2**63}'")
    assert_one_line_error(run("filters", "add", "alice", "--keywords", "x", "--source", "99", env=env),
                          "no source with id 99")
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(schema.filters)).scalar() == 0


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_webhook_secret_comes_from_a_file_standard_input_or_the_environment(engine, db_url, tmp_path):
    # Once it came on the command line only, where process listings and shell history
    # show it.
    env = {"DATABASE_URL": db_url}
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-a-file-0123456789\n")
    assert run("users", "add", "a", "--webhook", "https://h/a", "--secret-file", str(secret_file), env=env).returncode == 0
    assert run("users", "add", "b", "--webhook", "https://h/b", "--secret-file", "-", env=env,
               stdin="from-stdin-0123456789\n").returncode == 0
    assert run("users", "add", "c", "--webhook", "https://h/c",
               env={**env, "PIPELINE_WEBHOOK_SECRET": "from-the-env-0123456789"}).returncode == 0
    with engine.connect() as conn:
        stored = dict(conn.execute(sa.select(schema.users.c.name, schema.users.c.secret)).all())
    assert stored == {"a": "from-a-file-0123456789", "b": "from-stdin-0123456789", "c": "from-the-env-0123456789"}
    assert_one_line_error(run("users", "add", "d", "--webhook", "https://h/d", "--secret-file", "-", env=env,
                              stdin="short"), "at least 16 characters")
    refused = run("users", "add", "e", "--webhook", "https://h/e", "--secret", "on-the-command-line", env=env)
    assert refused.returncode == 2 and "No such option '--secret'" in refused.stderr


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_when_a_user_hears_is_set_from_the_command_line(engine, db_url):
    env = {"DATABASE_URL": db_url}
    run("users", "add", "alice", "--webhook", "https://hooks.example/a", env=env)
    done = run("users", "set", "alice", "--digest", "daily@07:30", "--quiet", "22:00-07:00", "--tz", "Europe/Berlin",
               env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "digest daily@07:30, quiet 22:00-07:00, Europe/Berlin"
    assert "(digest daily@07:30, quiet 22:00-07:00, Europe/Berlin)" in run("users", "list", env=env).stdout
    assert_one_line_error(run("users", "set", "alice", "--digest", "weekly", env=env), "digest 'weekly' is not one of")
    assert_one_line_error(run("users", "set", "alice", "--quiet", "22-7", env=env), "are not START-END")
    assert_one_line_error(run("users", "set", "alice", "--tz", "Mars/Olympus", env=env),
                          "time zone 'Mars/Olympus' is not an IANA time zone name")
    assert run("users", "set", "alice", "--digest", "immediate", "--quiet", "off", "--tz", "UTC",
               env=env).stdout.strip() == "immediate"
    with engine.connect() as conn:
        stored = conn.execute(sa.select(schema.users.c.digest, schema.users.c.quiet_hours,
                                        schema.users.c.timezone)).one()
    assert tuple(stored) == (None, None, None), "the defaults are stored as NULL"


def test_adding_a_filter_reads_the_sources_names_only_when_it_names_a_source(engine):
    """Adding a filter read every source's name, whether or not it named one: 30,000
    filters beside 100,000 sources took hours to add (bench/soak_stack.py's seeding).
    Counted by the statements sent, not by time."""
    from pipeline.catalogue.users import add_filter, add_user
    from tests.helpers import add_source

    read_sources: list[str] = []

    def capture(conn, cursor, statement, *args):
        if "FROM sources" in statement:
            read_sources.append(statement)

    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1:9/jobs", name="Nice Jobs")
        add_user(conn, "alice", webhook="https://hooks.example/a")
        sa.event.listen(engine, "before_cursor_execute", capture)
        try:
            add_filter(conn, "alice", "python remote")
            assert read_sources == [], "a filter naming no source reads no source"
            add_filter(conn, "alice", 'python source:"Nice Jobs"')
            assert read_sources, "one naming a source checks that it exists"
        finally:
            sa.event.remove(engine, "before_cursor_execute", capture)


def test_a_secret_the_pipeline_makes_is_taken_as_given_by_the_standard_webhooks_library(db_url, receiver):
    """The secret was token_urlsafe(32) used as raw bytes: the Standard Webhooks libraries,
    which read a secret string as base64 (after "whsec_"), refused every delivery unless
    the receiver read our code and wrote Webhook(secret.encode()). A secret made now is
    "whsec_" and base64, verified by the official library with the string as printed; a
    secret of the old form keeps verifying as before; a malformed whsec_ one is refused."""
    from standardwebhooks.webhooks import Webhook

    env = {"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}
    added = run("users", "add", "wanda", "--webhook", receiver.url("/hook"), env=env)
    assert added.returncode == 0, added
    [secret] = re.findall(r"whsec_[A-Za-z0-9+/=]+", added.stderr)
    assert run("users", "test", "wanda", env=env).returncode == 0
    [request] = receiver.requests
    Webhook(secret).verify(request["body"], dict(request["headers"]))  # raises if refused
    old = "receiver-shared-secret-0123"
    assert run("users", "add", "olaf", "--webhook", receiver.url("/hook"), "--secret-file", "-", stdin=old,
               env=env).returncode == 0
    assert run("users", "test", "olaf", env=env).returncode == 0
    Webhook(old.encode()).verify(receiver.requests[-1]["body"], dict(receiver.requests[-1]["headers"]))
    assert_one_line_error(run("users", "add", "xena", "--webhook", receiver.url("/hook"), "--secret-file", "-",
                              stdin="whsec_not base64 at all!", env=env), "not base64")
