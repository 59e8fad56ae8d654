"""Security: the SSRF guard against DNS tricks, secrets kept out of every output, and
values only ever sent as bound parameters.

Traffic goes to 127.0.0.1 and, as the address the guard must refuse, 127.0.0.2 (loopback
outside the allow-list); nothing is sent or redirected anywhere else.
"""

from __future__ import annotations

import json
import logging
import socket
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from assets import ASSET_CHECKS
from assets.stages import stage_assets
from pipeline.catalogue import users
from pipeline.core import redact
from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.net.http import Fetcher
from pipeline.storage import db, schema
from resources import PipelineDatabase
from tests.helpers import add_source
from tests.http_server import LocalServer
from tests.test_cli import assert_one_line_error, run

ALLOW = ("127.0.0.1/32",)
FEED = b'<?xml version="1.0"?><rss version="2.0"><channel><title>t</title><item><guid>1</guid><title>x</title><link>http://127.0.0.1/1</link></item></channel></rss>'


# -- the SSRF guard and DNS ---------------------------------------------------------------


@pytest.fixture
def two_loopbacks():
    """A server on 127.0.0.1 (allowed) and one on 127.0.0.2 (refused) at the same port."""
    allowed = LocalServer().start()
    refused = LocalServer(host="127.0.0.2", port=allowed.port).start()
    for server in (allowed, refused):
        server.routes["/feed"] = lambda h: h.reply(200, FEED)
    yield allowed, refused
    allowed.stop()
    refused.stop()


def fake_dns(monkeypatch: pytest.MonkeyPatch, name: str, *answers: list[str]) -> None:
    """``name`` resolves to the next list of ``answers`` on each lookup (a rebinding DNS
    server); every other name resolves as usual."""
    real = socket.getaddrinfo
    queue = list(answers)

    def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != name:
            return real(host, port, *args, **kwargs)
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, int(port))) for a in addresses]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_a_name_that_resolves_to_a_refused_address_is_never_connected(two_loopbacks, monkeypatch):
    allowed, refused = two_loopbacks
    fake_dns(monkeypatch, "feeds.example.test", ["127.0.0.2"])
    with Fetcher(timeout=2.0, allow_networks=ALLOW) as fetcher, pytest.raises(FetchError) as raised:
        fetcher.fetch(f"http://feeds.example.test:{allowed.port}/feed")
    assert raised.value.reason is FailureReason.BLOCKED_ADDRESS
    assert refused.requests == [] and allowed.requests == []


def test_a_rebinding_name_is_checked_at_every_connection(two_loopbacks, monkeypatch):
    """First lookup: the allowed address; second: the refused one. The guard vets the
    address it connects to, each time, so the second fetch never reaches 127.0.0.2."""
    allowed, refused = two_loopbacks
    fake_dns(monkeypatch, "rebind.example.test", ["127.0.0.1"], ["127.0.0.2"])
    url = f"http://rebind.example.test:{allowed.port}/feed"
    with Fetcher(timeout=2.0, allow_networks=ALLOW) as fetcher:
        assert fetcher.fetch(url).body == FEED
    with Fetcher(timeout=2.0, allow_networks=ALLOW) as fetcher, pytest.raises(FetchError) as raised:
        fetcher.fetch(url)
    assert raised.value.reason is FailureReason.BLOCKED_ADDRESS
    assert len(allowed.requests) == 1 and refused.requests == []


def test_of_several_addresses_only_an_allowed_one_is_used(two_loopbacks, monkeypatch):
    allowed, refused = two_loopbacks
    fake_dns(monkeypatch, "mixed.example.test", ["127.0.0.2", "127.0.0.1"])
    with Fetcher(timeout=2.0, allow_networks=ALLOW) as fetcher:
        assert fetcher.fetch(f"http://mixed.example.test:{allowed.port}/feed").body == FEED
    assert len(allowed.requests) == 1 and refused.requests == []


# -- secrets --------------------------------------------------------------------------------

WEBHOOK_SECRET = "whsec-SECRET-7f3a9c0d1e2b4a5c"
WEBHOOK_TOKEN = "TOKEN-SECRET-0a1b2c3d4e5f"  # a token in the webhook's path, as chat services do
API_KEY = "AIzaKEY-SECRET-9z8y7x6w5v"
DB_PASSWORD = "DBPASS-SECRET-1q2w3e"
SECRETS = (WEBHOOK_SECRET, WEBHOOK_TOKEN, API_KEY, DB_PASSWORD)


def with_password(url: str) -> str:
    """The test server trusts local connections: a password in the URL is accepted and
    ignored, so it can stand for a real one."""
    parsed = db.parse_url(url)
    if parsed.get_backend_name() != "postgresql":
        return url
    return parsed.set(password=DB_PASSWORD).render_as_string(hide_password=False)


def test_secrets_never_reach_logs_run_metadata_telemetry_or_listings(engine, db_url, monkeypatch, caplog):
    server = LocalServer().start()
    server.routes[f"/hook/{WEBHOOK_TOKEN}"] = lambda h: h.reply(500, b"receiver down")
    server.routes["/feed"] = lambda h: h.reply(200, FEED.replace(b"<title>x</title>", b"<title>Python</title>"))
    # An API that echoes the key in its error message, as a hostile or buggy one might.
    server.routes["/api/playlistItems"] = lambda h: h.reply(400, json.dumps({"error": {
        "message": f"API key {API_KEY} not valid", "errors": [{"reason": "keyInvalid"}]}}).encode())
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    url = with_password(db_url)
    with engine.begin() as conn:
        add_source(conn, server.url("/feed"))
        add_source(conn, "https://www.youtube.com/channel/UCabcdefghijklmnopqrstuv", source_type="youtube",
                   config={"api_key": API_KEY, "api_base": server.url("/api")})
        users.add_user(conn, "alice", webhook=server.url(f"/hook/{WEBHOOK_TOKEN}"), secret=WEBHOOK_SECRET)
        users.add_filter(conn, "alice", "python")
    caplog.set_level(logging.DEBUG)
    result = dg.materialize([stage_assets, *ASSET_CHECKS],
                            resources={"database": PipelineDatabase(database_url=url)})
    assert result.success
    server.stop()
    posted = [r for r in server.requests if r["method"] == "POST"]
    assert posted and all(WEBHOOK_SECRET not in str(r) for r in posted), "the secret signs; it is never sent"

    outputs = {
        "logs": caplog.text,
        "dagster events": "\n".join(str(event) for event in result.all_events),
    }
    with engine.connect() as conn:
        for table in (schema.ingestion_events, schema.notifications, schema.worker_state, schema.listings,
                      schema.listings_raw):
            outputs[table.name] = json.dumps([dict(r) for r in conn.execute(sa.select(table)).mappings()],
                                             default=str)
        # What the run left behind must prove it ran into each secret's path.
        errors = [r.details for r in conn.execute(sa.select(schema.ingestion_events.c.details)) if r.details]
        dead_or_failed = conn.execute(sa.select(schema.notifications.c.last_error)).scalars().all()
    assert any("keyInvalid" in e.get("error", "") and "***" in e["error"] for e in errors), errors
    assert dead_or_failed and all("http_5xx" in (e or "") for e in dead_or_failed)
    for command in (("status", "--json"), ("sources", "list", "--json"), ("users", "list", "--json")):
        shown = run(*command, env={"DATABASE_URL": url})
        assert shown.returncode == 0, shown.stderr
        outputs[" ".join(command)] = shown.stdout + shown.stderr
    unreachable = db.parse_url(url).set(port=9).render_as_string(hide_password=False)
    outputs["an error"] = run("status", env={"DATABASE_URL": unreachable}).stderr
    for where, text in outputs.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret} appears in {where}"


def test_a_failing_statement_never_shows_its_parameters(engine):
    t = schema.users
    with engine.begin() as conn:
        conn.execute(sa.insert(t).values(name="bob", channel="webhook", channel_url="http://x", secret="s" * 16))
    with pytest.raises(sa.exc.IntegrityError) as raised, engine.begin() as conn:
        conn.execute(sa.insert(t).values(name="bob", channel="webhook", channel_url="http://x",
                                         secret=WEBHOOK_SECRET))
    assert WEBHOOK_SECRET not in str(raised.value) and "INSERT INTO users" in str(raised.value)


# -- bound parameters -----------------------------------------------------------------------

HOSTILE = "x'); DROP TABLE sources; -- MARKER-7c1d"


def test_every_value_travels_as_a_bound_parameter(engine, db_url, monkeypatch):
    """A full pass with hostile text in every field a user or a feed controls: the text
    reaches the database intact, and never as part of a statement."""
    statements: list[str] = []

    def capture(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    server = LocalServer().start()
    item = (f"<item><guid>{HOSTILE}</guid><title>Python {HOSTILE}</title><link>http://127.0.0.1/a</link>"
            f"<category>{HOSTILE}</category><description>{HOSTILE}</description></item>")
    server.routes["/feed"] = lambda h: h.reply(200, FEED.replace(b"<item>", item.encode() + b"<item>"))
    server.routes["/hook"] = lambda h: h.reply(204)
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", capture)
    try:
        with engine.begin() as conn:
            add_source(conn, server.url("/feed"), name=HOSTILE)
            users.add_user(conn, HOSTILE, webhook=server.url("/hook"), secret="s" * 16)
            users.add_filter(conn, HOSTILE, "python", category=HOSTILE)
        result = dg.materialize([stage_assets],
                                resources={"database": PipelineDatabase(database_url=db_url)})
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", capture)
        server.stop()
    assert result.success
    assert len(statements) > 20
    assert not [s for s in statements if "MARKER-7c1d" in s]
    with engine.connect() as conn:
        [stored] = conn.execute(sa.select(schema.listings).where(schema.listings.c.source_item_id == HOSTILE)).mappings()
    assert stored["title"] == f"Python {HOSTILE}" and HOSTILE in stored["categories"]
    assert [r for r in server.requests if r["method"] == "POST"], "the hostile filter matched and was delivered"


# -- operator input and what is printed of secrets ---------------------------------------

TOO_BIG_ID = str(2**64 + 1)


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
@pytest.mark.parametrize("command", [
    ("sources", "disable", TOO_BIG_ID), ("sources", "refresh", TOO_BIG_ID), ("backfill", "refetch", TOO_BIG_ID),
    ("filters", "disable", TOO_BIG_ID), ("sources", "enable", "0"),
])
def test_an_id_out_of_range_is_refused_before_the_database(engine, db_url, command):
    # Once, an id past 64 bits reached PostgreSQL and came back as a 49-line traceback.
    result = run(*command, env={"DATABASE_URL": db_url})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "is not in the range 1<=x<=9223372036854775807" in result.stderr


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
@pytest.mark.parametrize(("args", "fragment"), [
    (["http://127.0.0.1/a", "--config", '{"a":' + "[" * 30_000 + "]" * 30_000 + "}"], "nested too deeply"),
    (["http://127.0.0.1/a", "--config", '{"a":' * 40 + "1" + "}" * 40], "nested too deeply"),
    (["http://127.0.0.1/a", "--name", "bad\x01name"], "name contains a control character"),
    (["http://127.0.0.1/a", "--category", "c" * 5000], "category is 5,000 characters long; at most 1,000"),
    (["http://127.0.0.1/" + "a" * 3000], "the URL is 3,017 characters long; at most 2,048"),
    (["https://www.youtube.com/@name", "--config", '{"api_key": "KEY-\\u0000-SECRET"}'],
     "config contains a control character"),
])
def test_bad_operator_input_is_one_line_naming_the_field(engine, db_url, args, fragment):
    result = run("sources", "add", *args, env={"DATABASE_URL": db_url})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and fragment in result.stderr, result.stderr[-500:]
    assert "SECRET" not in result.stderr


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_nul_in_an_import_file_names_the_entry_and_never_quotes_the_key(engine, db_url, tmp_path):
    # Once, the NUL reached PostgreSQL, whose error quoted the bound parameter (the
    # YouTube API key included) in its CONTEXT line. One bad entry rejects the file.
    listing = tmp_path / "sources.yaml"
    listing.write_text(
        "- url: http://127.0.0.1/ok\n"
        f"- url: https://www.youtube.com/channel/UCabcdefghijklmnopqrstuv\n  name: \"bad\\0name\"\n"
        f"  config: {{api_key: {API_KEY}}}\n"
    )
    result = run("sources", "import", str(listing), env={"DATABASE_URL": db_url})
    assert "Traceback" not in result.stderr and API_KEY not in result.stdout + result.stderr
    assert result.returncode == 1 and "entry 2" in result.stderr, result.stderr
    assert "name contains a control character" in result.stderr
    with engine.connect() as conn:
        assert conn.execute(sa.select(schema.sources.c.url)).scalars().all() == []


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_database_error_prints_its_first_line_never_its_parameters(engine, db_url, monkeypatch):
    # Whatever slips past the checks: the server's CONTEXT line, which quotes the bound
    # value, is never printed. A trigger refuses the insert, quoting the value as
    # PostgreSQL's own errors do.
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'refused' USING DETAIL = 'value ' || NEW.name; END $$")
        conn.exec_driver_sql(
            "CREATE TRIGGER test_refuse BEFORE INSERT ON sources FOR EACH ROW EXECUTE FUNCTION test_refuse()")
    result = run("sources", "add", "http://127.0.0.1/a", "--name", f"name-{API_KEY}", env={"DATABASE_URL": db_url})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == "pipeline: database error: refused"


@pytest.mark.parametrize(("url", "shown"), [
    ("prowl://APIKEY0123456789/PROVIDERKEY", "prowl://…"),
    ("pbul://TOKEN0123456789", "pbul://…"),
    ("opsgenie://APIKEY0123456789", "opsgenie://…"),
    ("slack://TokenA/TokenB/TokenC", "slack://…"),
    ("unknown-scheme://SECRET0123/x", "unknown-scheme://…"),
    ("json://127.0.0.1:8080/hook/TOKEN", "json://127.0.0.1/…"),
    ("mailto://user:PASSWORD@mail.example.com", "mailto://mail.example.com/…"),
    ("https://hooks.example.com/services/T0/B0/TOKEN0123", "https://hooks.example.com/…"),
    # No scheme: what was typed, as far as it is no credential.
    ("notaurl", "notaurl"),
    ("hooks.example.com/services/T0/B0/TOKEN0123", "hooks.example.com/…"),
    ("PASSWORD0123@hooks.example.com/x", "hooks.example.com/…"),
    ("TOKEN0123456789ABCDEF", "…"),
])
def test_a_channel_url_is_shown_by_its_structure(url, shown):
    # Once, prowl://APIKEY printed as it was: "scheme://host" kept the credential.
    assert redact.channel_url(url) == shown


def test_a_database_url_hides_its_password_and_query_values():
    shown = db.display_url(f"postgresql://app:{DB_PASSWORD}@db.example.com/app?password={DB_PASSWORD}&sslmode=require")
    assert DB_PASSWORD not in shown and shown.startswith("postgresql://app:***@db.example.com/app?password=***")


@pytest.mark.parametrize("url, fragments", [
    # A password with "@" not written %40: SQLAlchemy ends it at the first "@", the
    # operator meant the last, and the redaction showed the rest of it.
    ("postgresql://postgres:p@ssw0rd-XYZ-42@127.0.0.1/db", ("postgresql://***@127.0.0.1/db", "%40")),
    ("postgresql://postgres@127.0.0.1:abc/x", ("port is not a number",)),  # was a 37-line traceback
    ("nonsense", ("is not a database URL",)),
    ("postgresql://app:s3cret-pw@127.0.0.1:99999999999/x", ("port",)),  # the driver says so, in one line
], ids=["an @ in the password", "a port that is no number", "no URL", "a port out of range"])
def test_a_malformed_database_url_is_one_line_that_shows_no_part_of_its_password(url, fragments):
    done = run("status", env={"DATABASE_URL": url})
    assert_one_line_error(done, *fragments)
    for secret in ("ssw0rd", "XYZ-42", "s3cret"):
        assert secret not in done.stderr


PATH_TOKEN = "https://hooks.example/hook/Ab%2BcD0123456789_xyz"
QUERY_TOKEN = "https://hooks.example/hook?key=Ab+cD0123456789%2Fxyz"


@pytest.mark.parametrize("url, echoed", [
    (PATH_TOKEN, "no route for /hook/Ab%2BcD0123456789_xyz"),  # as sent
    (PATH_TOKEN, "no route for /hook/Ab+cD0123456789_xyz"),  # decoded, as many routers report a path
    (QUERY_TOKEN, "bad key 'Ab cD0123456789/xyz'"),  # a query value decoded: "+" is a space
    (QUERY_TOKEN, "bad key Ab+cD0123456789/xyz"),
], ids=["path as sent", "path decoded", "query decoded", "query half decoded"])
def test_a_channel_s_token_is_scrubbed_as_sent_and_as_a_receiver_decodes_it(url, echoed):
    """A receiver echoing the path decoded got the token shown in `users test`,
    `last_error` and `notifications list`: the scrub matched the raw form only."""
    scrubbed = redact.scrub(echoed, redact.channel_secrets(url))
    assert "cD0123" not in scrubbed, scrubbed


def test_a_key_echoed_truncated_is_scrubbed_too():
    echoed = f"API key {API_KEY[:12]}... not valid; the whole key was {API_KEY}"
    scrubbed = redact.scrub(echoed, [API_KEY])
    assert API_KEY[:redact.SECRET_PREFIX_CHARS] not in scrubbed and scrubbed.count(redact.MASK) == 2


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_planted_secrets_never_reach_command_output(engine, db_url):
    env = {"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"}
    prowl = "prowl://PROWLKEY0123456789abcdef0123456789abcdef"  # 40 characters, as Prowl's are
    assert run("users", "add", "p", "--apprise", prowl, env=env).returncode == 0
    assert run("users", "add", "w", "--webhook", f"https://127.0.0.1/hook/{WEBHOOK_TOKEN}", env=env).returncode == 0
    # A routed filter's own channel and secret (`filters route`) are as secret as a user's.
    first, second = (run("filters", "add", "w", "--query", q, env=env).stdout.strip() for q in ("python", "rust"))
    routed = run("filters", "route", first, "--apprise", prowl, env=env)
    assert routed.returncode == 0, routed
    by_webhook = run("filters", "route", second, "--webhook", f"https://127.0.0.1/hook/{WEBHOOK_TOKEN}",
                     "--secret-file", "-", env=env, stdin=WEBHOOK_SECRET)
    assert by_webhook.returncode == 0, by_webhook
    outputs = {
        "users list": run("users", "list", env=env).stdout,
        "users list --json": run("users", "list", "--json", env=env).stdout,
        "filters list": run("filters", "list", env=env).stdout,
        "filters list --json": run("filters", "list", "--json", env=env).stdout,
        "filters route": routed.stdout + routed.stderr + by_webhook.stdout + by_webhook.stderr,
        "a refused webhook": run("users", "add", "x", "--webhook", f"ftp://h/{WEBHOOK_TOKEN}", env=env).stderr,
        "db current, query password": run("db", "upgrade", env={
            "DATABASE_URL": f"{db_url}{'&' if '?' in db_url else '?'}password={DB_PASSWORD}"}).stdout,
    }
    for where, text in outputs.items():
        for secret in ("PROWLKEY0123", WEBHOOK_TOKEN, DB_PASSWORD, WEBHOOK_SECRET):
            assert secret not in text, f"{secret} appears in {where}: {text}"
    assert "prowl://…" in outputs["users list"] and "password=***" in outputs["db current, query password"]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("command", [("db", "upgrade", "9999"), ("db", "downgrade", "nonsense")])
def test_an_unknown_schema_revision_is_one_line(db_url, command):
    assert_one_line_error(run(*command, env={"DATABASE_URL": db_url}), "no schema revision")


def test_a_receiver_echoing_the_webhooks_secret_path_never_gets_it_stored_or_printed(engine, db_url):
    """A receiver answering `404 no route for /hook/TOKEN` once put the token into
    `notify`'s output and `notifications.last_error` (its reason phrase, copied)."""
    from tests.test_notifier import add_listing

    receiver = LocalServer().start()

    def echo(h: Any) -> None:
        h.send_response(404, f"no route for {h.path}")
        h.send_header("Content-Length", "0")
        h.end_headers()

    receiver.routes[f"/hook/{WEBHOOK_TOKEN}"] = echo
    try:
        with engine.begin() as conn:
            users.add_user(conn, "alice", webhook=receiver.url(f"/hook/{WEBHOOK_TOKEN}"), secret=WEBHOOK_SECRET)
            users.add_filter(conn, "alice", "python")
            add_listing(conn, add_source(conn, "http://127.0.0.1:9/feed"), "a", "Python developer")
        result = run("notify", env={"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"})
    finally:
        receiver.stop()
    assert receiver.requests, "the receiver was asked"
    with engine.connect() as conn:
        [error] = conn.execute(sa.select(schema.notifications.c.last_error)).scalars().all()
    assert "404" in error and "no route for /hook/***" in error, error
    for text in (error, result.stdout, result.stderr):
        assert WEBHOOK_TOKEN not in text and WEBHOOK_TOKEN[:redact.SECRET_PREFIX_CHARS] not in text
