"""pipeline/net/http.py against a real server on 127.0.0.1: every failure code it can produce,
conditional GET, redirects, the size cap, the deadline, the per-host limit, the guard.

The SSRF guard is exercised only with loopback addresses outside the allow-list
(127.0.0.2); no test sends or redirects traffic anywhere else.
"""

from __future__ import annotations

import gzip
import ipaddress
import socket
import threading
import time
import tracemalloc
import zlib
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.core.backoff import BackoffPolicy, clamp_retry_after
from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.net.http import USER_AGENT, AddressGuard, Fetcher, parse_retry_after
from pipeline.notify.delivery import RETRY_CAP, delivery_retry_at
from tests.http_server import Handler, InFlight, LocalServer

FEED = b"<rss version='2.0'><channel><title>t</title></channel></rss>"
ALLOW = ["127.0.0.1/32"]
CAP = 64 * 1024


@pytest.fixture
def server():
    srv = LocalServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def fetcher():
    """A fetcher whose deadline no busy machine reaches: for tests about what is answered,
    not when (tracemalloc slows the process several times over)."""
    with Fetcher(timeout=60.0, max_bytes=CAP, allow_networks=ALLOW) as f:
        yield f


@pytest.fixture
def hasty():
    """A fetcher that gives up after 1 s: for routes made to outlast it."""
    with Fetcher(timeout=1.0, max_bytes=CAP, allow_networks=ALLOW) as f:
        yield f


def failure(fetcher: Fetcher, url: str) -> FetchError:
    with pytest.raises(FetchError) as caught:
        fetcher.fetch(url)
    return caught.value


def feed_route(h: Handler) -> None:
    if h.headers.get("If-None-Match") == '"v1"':
        h.reply(304, headers={"ETag": '"v1"'})
    else:
        h.reply(200, FEED, {
            "Content-Type": "application/rss+xml", "ETag": '"v1"',
            "Last-Modified": "Sat, 21 Nov 2026 10:00:00 GMT",
        })


def test_fetch_returns_body_and_validators_then_304_adds_nothing(server, fetcher):
    server.routes["/feed"] = feed_route
    first = fetcher.fetch(server.url("/feed"))
    assert (first.status, first.body, first.etag) == (200, FEED, '"v1"')
    assert first.last_modified == "Sat, 21 Nov 2026 10:00:00 GMT"
    again = fetcher.fetch(server.url("/feed"), etag=first.etag, last_modified=first.last_modified)
    assert again.not_modified and again.body == b""
    sent = server.requests[-1]["headers"]
    assert sent["If-None-Match"] == '"v1"'
    assert sent["If-Modified-Since"] == "Sat, 21 Nov 2026 10:00:00 GMT"


def test_real_user_agent_gzip_and_one_reused_connection(server, fetcher):
    server.routes["/gz"] = lambda h: h.reply(200, gzip.compress(FEED), {"Content-Encoding": "gzip"})
    for _ in range(5):
        assert fetcher.fetch(server.url("/gz")).body == FEED
    assert server.requests[0]["headers"]["User-Agent"] == USER_AGENT
    assert "gzip" in server.requests[0]["headers"]["Accept-Encoding"]
    assert len(server.connections) == 1, "keep-alive: five fetches, one connection"


def test_each_thread_keeps_its_own_connections_and_close_ends_them_all(server):
    """httpcore's pool scans every connection it holds on each request and release: one
    pool per thread keeps that scan short. Each thread still reuses its connection, and
    closing the Fetcher closes every thread's."""
    server.routes["/feed"] = feed_route
    fetcher = Fetcher(allow_networks=["127.0.0.1/32"])
    barrier = threading.Barrier(3)

    def fetch_three() -> None:
        barrier.wait()  # all three threads hold a connection at once
        for _ in range(3):
            assert fetcher.fetch(server.url("/feed")).body == FEED

    threads = [threading.Thread(target=fetch_three) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(server.requests) == 9 and len(server.connections) == 3, "one kept-alive connection per thread"
    transports = list(fetcher._transports)
    assert len(transports) == 3 and all(t._pool.connections for t in transports)
    fetcher.close()
    assert not any(t._pool.connections for t in transports)


def test_not_modified_and_error_answers_keep_the_connection_too(server, fetcher):
    server.routes["/feed"] = feed_route
    server.routes["/missing"] = lambda h: h.reply(404, b"{\"error\": \"no such feed\"}")
    fetcher.fetch(server.url("/feed"))
    for _ in range(3):
        assert fetcher.fetch(server.url("/feed"), etag='"v1"').not_modified
        assert failure(fetcher, server.url("/missing")).body == b'{"error": "no such feed"}'
    assert len(server.connections) == 1, "a 304 or a 404 read to its end leaves the connection open"


def test_an_error_body_is_kept_only_up_to_its_excerpt_size(server, fetcher):
    server.routes["/big-error"] = lambda h: h.reply(500, b"x" * (CAP * 4))
    error = failure(fetcher, server.url("/big-error"))
    assert error.reason is FailureReason.HTTP_5XX and len(error.body) == min(CAP, 64 * 1024)


def test_cookies_set_by_one_source_never_reach_another(server, fetcher):
    server.routes["/set"] = lambda h: h.reply(200, FEED, {"Set-Cookie": "session=abc; Path=/"})
    server.routes["/feed"] = feed_route
    fetcher.fetch(server.url("/set"))
    fetcher.fetch(server.url("/feed"))
    assert "Cookie" not in server.requests[-1]["headers"]


def test_extra_headers_go_to_the_first_origin_only():
    first, other = LocalServer().start(), LocalServer().start()
    try:
        other.routes["/feed"] = feed_route
        first.routes["/same"] = lambda h: h.reply(302, headers={"Location": "/moved"})
        first.routes["/moved"] = feed_route
        first.routes["/away"] = lambda h: h.reply(302, headers={"Location": other.url("/feed")})
        with Fetcher(timeout=2.0, allow_networks=ALLOW) as fetcher:
            fetcher.fetch(first.url("/same"), headers={"X-Api-Key": "k1"})
            fetcher.fetch(first.url("/away"), headers={"X-Api-Key": "k1"})
        assert [r["headers"].get("X-Api-Key") for r in first.requests] == ["k1", "k1", "k1"]
        assert "X-Api-Key" not in other.requests[0]["headers"], "no key for another origin"
    finally:
        first.stop()
        other.stop()


@pytest.mark.parametrize(
    ("status", "reason"),
    [(404, FailureReason.HTTP_4XX), (410, FailureReason.HTTP_4XX), (500, FailureReason.HTTP_5XX),
     (503, FailureReason.HTTP_5XX), (429, FailureReason.RATE_LIMITED)],
)
def test_status_codes_map_to_the_taxonomy(server, fetcher, status, reason):
    server.routes["/x"] = lambda h: h.reply(status, b"no")
    error = failure(fetcher, server.url("/x"))
    assert (error.reason, error.http_status) == (reason, status)


def test_retry_after_seconds_and_http_date(server, fetcher):
    server.routes["/429"] = lambda h: h.reply(429, headers={"Retry-After": "120"})
    when = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    server.routes["/503"] = lambda h: h.reply(503, headers={"Retry-After": "Tue, 01 Jan 2030 12:00:00 GMT"})
    before = datetime.now(UTC)
    limited = failure(fetcher, server.url("/429"))
    assert before + timedelta(seconds=119) < limited.retry_after < datetime.now(UTC) + timedelta(seconds=121)
    assert failure(fetcher, server.url("/503")).retry_after == when


def test_parse_retry_after_ignores_garbage():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None
    assert parse_retry_after("0", now) == now


def test_body_over_the_cap_is_too_large_declared_or_streamed(server, fetcher):
    big = b"x" * (CAP + 1)
    server.routes["/declared"] = lambda h: h.reply(200, big)

    def chunked(h: Handler) -> None:  # no Content-Length: only counting can stop it
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for _ in range(CAP // 1024 + 8):
            h.wfile.write(b"400\r\n" + b"y" * 1024 + b"\r\n")
        h.wfile.write(b"0\r\n\r\n")

    server.routes["/chunked"] = chunked
    bomb = gzip.compress(b"\0" * (CAP * 50))  # about 6 KB on the wire
    server.routes["/bomb"] = lambda h: h.reply(200, bomb, {"Content-Encoding": "gzip"})
    for path in ("/declared", "/chunked", "/bomb"):
        assert failure(fetcher, server.url(path)).reason is FailureReason.TOO_LARGE, path


def test_a_server_slower_than_the_timeout(server, hasty):
    """Waits for the fetcher's own timeout: the server answers only after it."""
    # The server does answer, once the fetch is over: a timeout (not a 200) proves the
    # fetcher gave up first.
    over = threading.Event()
    server.routes["/slow"] = lambda h: (over.wait(60), h.reply(200, FEED))
    try:
        assert failure(hasty, server.url("/slow")).reason is FailureReason.TIMEOUT
    finally:
        over.set()


def test_a_server_that_drips_bytes_hits_the_overall_deadline(server, hasty):
    """Waits for the exchange's own deadline, which only the drip can reach."""
    def drip(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        for _ in range(1000):  # each byte well within the read timeout
            h.wfile.write(b"z")
            h.wfile.flush()
            time.sleep(0.05)

    server.routes["/drip"] = drip
    started = time.monotonic()
    assert failure(hasty, server.url("/drip")).reason is FailureReason.TIMEOUT
    assert time.monotonic() - started < 10, "stopped at the deadline, not after the 50 s drip"


def test_permanent_redirect_reports_the_new_url(server, fetcher):
    server.routes["/feed"] = feed_route
    server.routes["/old"] = lambda h: h.reply(301, headers={"Location": "/feed"})
    server.routes["/temp"] = lambda h: h.reply(302, headers={"Location": "/feed"})
    server.routes["/old-then-temp"] = lambda h: h.reply(308, headers={"Location": "/temp"})
    moved = fetcher.fetch(server.url("/old"))
    assert (moved.body, moved.moved_to, moved.url) == (FEED, server.url("/feed"), server.url("/feed"))
    assert fetcher.fetch(server.url("/temp")).moved_to is None
    assert fetcher.fetch(server.url("/old-then-temp")).moved_to == server.url("/temp")


def test_a_redirect_loop_stops_after_five_hops(server, fetcher):
    server.routes["/loop"] = lambda h: h.reply(302, headers={"Location": "/loop"})
    error = failure(fetcher, server.url("/loop"))
    assert error.reason is FailureReason.HTTP_4XX and "more than 5 redirects" in str(error)
    assert len(server.requests) == 6


def test_a_redirect_to_a_blocked_address_is_refused_at_that_hop(server, fetcher):
    server.routes["/feed"] = feed_route
    server.routes["/jump"] = lambda h: h.reply(302, headers={"Location": server.url("/feed", host="127.0.0.2")})
    error = failure(fetcher, server.url("/jump"))
    assert error.reason is FailureReason.BLOCKED_ADDRESS and "127.0.0.2" in str(error)
    assert [r["path"] for r in server.requests] == ["/jump"]


def test_loopback_outside_the_allow_list_is_blocked(server):
    server.routes["/feed"] = feed_route
    with Fetcher(timeout=1.0, allow_networks=ALLOW) as allowed:
        assert failure(allowed, server.url("/feed", host="127.0.0.2")).reason is FailureReason.BLOCKED_ADDRESS
    with Fetcher(timeout=1.0) as default:  # empty allow-list: even 127.0.0.1 is refused
        assert failure(default, server.url("/feed")).reason is FailureReason.BLOCKED_ADDRESS
    assert server.requests == [], "a blocked address is never connected to"


def test_a_redirect_to_another_scheme_is_refused(server, fetcher):
    server.routes["/ftp"] = lambda h: h.reply(302, headers={"Location": "ftp://127.0.0.1/x"})
    assert failure(fetcher, server.url("/ftp")).reason is FailureReason.BLOCKED_ADDRESS


def test_a_refused_connection_is_a_network_error(fetcher):
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert failure(fetcher, f"http://127.0.0.1:{port}/").reason is FailureReason.NETWORK_ERROR


@pytest.mark.parametrize(
    "address",
    ["127.0.0.2", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
     "0.0.0.0", "224.0.0.1", "240.0.0.1", "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.2",
     "::ffff:10.0.0.1", "::", "fec0::1", "2002:7f00:2::1", "64:ff9b::7f00:2", "64:ff9b::a00:1"],
)
def test_the_guard_refuses_non_public_addresses(address):
    assert AddressGuard(ALLOW).refuses(ipaddress.ip_address(address))


def test_the_allow_list_exempts_only_its_ranges():
    guard = AddressGuard(ALLOW)
    assert not guard.refuses(ipaddress.ip_address("127.0.0.1"))
    assert not guard.refuses(ipaddress.ip_address("::ffff:127.0.0.1"))
    assert not guard.refuses(ipaddress.ip_address("93.184.216.34")), "public addresses pass"
    with pytest.raises(ValueError, match="PIPELINE_ALLOW_NETWORKS"):
        AddressGuard(["not-a-network"])


def test_at_most_per_host_posts_at_once_and_waiting_is_not_a_timeout(server):
    in_flight = InFlight()
    server.routes["/hold"] = in_flight.holding(lambda h: h.reply(204), seconds=0.5)
    # Ten posts, two at a time, each held 0.5 s, with a 2 s timeout: the last pair waits
    # 2 s for a slot, and that wait is not counted against its deadline.
    with Fetcher(timeout=2.0, allow_networks=ALLOW, per_host=2) as fetcher, ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda _: fetcher.post(server.url("/hold"), b"{}", {}), range(10)))
    assert results == [204] * 10
    assert in_flight.peak == 2


# -- hostile servers: one deadline for the whole exchange, bounded decoding ------------


def dripping(lines: list[bytes], pause: float, finished: threading.Event):
    """A route that writes ``lines`` raw, one every ``pause`` seconds, then a response;
    ``finished`` is set only if it got to the end (the client never hung up on it)."""

    def route(h: Handler) -> None:
        try:
            for line in lines:
                h.wfile.write(line)
                h.wfile.flush()
                time.sleep(pause)
            h.wfile.write(b"Content-Length: 0\r\n\r\n")
            h.wfile.flush()
            finished.set()
        except OSError:
            h.close_connection = True

    return route


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("shape", ["header lines", "interim responses"])
def test_headers_and_interim_responses_are_bound_by_the_overall_deadline(server, method, shape):
    # Each line arrives well within the read timeout, so only the exchange's deadline
    # (1 s) can end it; the server would go on for 60 s.
    if shape == "header lines":
        lines = [b"HTTP/1.1 200 OK\r\n"] + [b"X-Drip-%d: x\r\n" % i for i in range(300)]
    else:
        lines = [b"HTTP/1.1 100 Continue\r\n\r\n"] * 300 + [b"HTTP/1.1 200 OK\r\n"]
    finished = threading.Event()
    server.routes["/drip"] = dripping(lines, 0.2, finished)
    with Fetcher(timeout=1.0, allow_networks=ALLOW) as fetcher, pytest.raises(FetchError) as caught:
        if method == "GET":
            fetcher.fetch(server.url("/drip"))
        else:
            fetcher.post(server.url("/drip"), b"{}", {})
    assert caught.value.reason is FailureReason.TIMEOUT, caught.value
    assert not finished.is_set(), "the fetch waited for the server's last header"


def peak_memory_of(call) -> int:
    tracemalloc.start()
    try:
        call()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_a_compression_bomb_is_inflated_in_steps_never_whole(server, fetcher):
    # 60 MiB of zeros, about 60 KB on the wire (under the 64 KiB cap, so its length does
    # not give it away): a chunk of it read from the socket inflates to tens of MiB at
    # once unless decoding stops at the cap as it goes.
    bomb = gzip.compress(b"\0" * (60 * 1024 * 1024), compresslevel=9)
    assert len(bomb) < CAP
    server.routes["/bomb"] = lambda h: h.reply(200, bomb, {"Content-Encoding": "gzip"})
    reasons = []
    peak = peak_memory_of(lambda: reasons.append(failure(fetcher, server.url("/bomb")).reason))
    assert reasons == [FailureReason.TOO_LARGE]
    assert peak < 8 * 1024 * 1024, f"{peak / 2**20:.0f} MiB allocated to refuse a body capped at 64 KiB"


def test_a_layered_or_unknown_content_encoding_is_refused(server, fetcher):
    # 1 GiB of zeros, gzipped twice: a few KB on the wire, a million times that inflated.
    inner = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)
    layered = gzip.compress(inner, compresslevel=9)
    server.routes["/layered"] = lambda h: h.reply(200, layered, {"Content-Encoding": "gzip, gzip"})
    server.routes["/unknown"] = lambda h: h.reply(200, b"...", {"Content-Encoding": "compress"})
    for path in ("/layered", "/unknown"):
        error = []
        peak = peak_memory_of(lambda p=path, e=error: e.append(failure(fetcher, server.url(p))))
        assert error[0].reason is FailureReason.PARSE_ERROR and "Content-Encoding" in error[0].message, error
        assert peak < 8 * 1024 * 1024, f"{path}: {peak / 2**20:.0f} MiB allocated"


def test_gzip_members_deflate_and_raw_deflate_are_decoded(server, fetcher):
    text = b"<rss>" + b"caf\xc3\xa9 " * 30000 + b"</rss>"  # 180 KB: several inflate steps
    half = len(text) // 2
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    bodies = {
        "/gzip": (gzip.compress(text), "gzip"),
        "/members": (gzip.compress(text[:half]) + gzip.compress(text[half:]), "gzip"),
        "/deflate": (zlib.compress(text), "deflate"),
        "/raw-deflate": (raw.compress(text) + raw.flush(), "deflate"),
        "/identity": (text, "identity"),
    }
    for path, (body, coding) in bodies.items():
        server.routes[path] = lambda h, b=body, c=coding: h.reply(200, b, {"Content-Encoding": c})
    with Fetcher(timeout=60.0, allow_networks=ALLOW) as big_enough:
        for path in bodies:
            assert big_enough.fetch(server.url(path)).body == text, path
    assert server.requests[-1]["headers"]["Accept-Encoding"] == "gzip, deflate"


def test_a_hostile_retry_after_never_overflows_or_parks_past_the_caps():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    # Far past every cap, but a time: the caps then apply (tests/test_backoff.py).
    assert parse_retry_after("1000000000000", now) == now + timedelta(seconds=10**9)
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now).year == 9999
    assert parse_retry_after("Fri, 31 Dec 99999 23:59:59 GMT", now) is None
    year_9999 = datetime(9999, 12, 31, tzinfo=UTC)
    assert delivery_retry_at(1, now, 0.5, year_9999) == now + RETRY_CAP
    assert clamp_retry_after(FailureReason.RATE_LIMITED, year_9999, now) == now + BackoffPolicy().transient_cap


def test_a_response_past_its_length_never_passes_for_the_next_one(server, fetcher):
    # Once, the bytes after a response's Content-Length stayed on the pooled connection
    # and the next fetch of that origin read them as its own answer: one path's content
    # forged another's.
    forged = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nFORGED"

    def overrun(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "5")
        h.end_headers()
        h.wfile.write(b"hello" + forged)  # one write: the extra bytes arrive with the body

    server.routes["/overrun"] = overrun
    server.routes["/other"] = lambda h: h.reply(200, b"the real answer")
    assert fetcher.fetch(server.url("/overrun")).body == b"hello"
    assert fetcher.fetch(server.url("/other")).body == b"the real answer"
    # The answer came on a fresh connection: the spoiled one was closed unread. (Whether
    # the server ever reads the ask sent on the spoiled one is a race it may lose: that
    # connection is closed with an answer unread, and its reset can drop the request.)
    spoiled = server.requests[0]["port"]
    assert server.requests[0]["path"] == "/overrun"
    assert any(r["path"] == "/other" and r["port"] != spoiled for r in server.requests), server.requests
    # A webhook post is not sent twice (the server may have read it): it fails instead.
    assert fetcher.fetch(server.url("/overrun")).body == b"hello"
    with pytest.raises(FetchError) as caught:
        fetcher.post(server.url("/other"), b"{}", {})
    assert caught.value.reason is FailureReason.NETWORK_ERROR and "ran past its length" in caught.value.message


def test_fetchers_share_one_tls_context() -> None:
    """Loading the CA bundle costs about 16 ms of CPU, and a Fetcher is made for every
    pass of a stage: a collector pass that found nothing due spent it each time. Every
    Fetcher now shares one verifying context, made once per process."""
    import ssl

    with Fetcher() as one, Fetcher() as two:
        assert one._ssl_context is two._ssl_context
        assert one._ssl_context.verify_mode == ssl.CERT_REQUIRED and one._ssl_context.check_hostname
