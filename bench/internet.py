"""A simulated internet on loopback (issue 36, its first piece): feeds on many hosts, each
host a distinct loopback address (127.1.x.y: Linux routes all of 127.0.0.0/8 to lo, so
nothing is set up), answering as real hosts do, and a log of what it did that the
pipeline's results are audited against.

Each host serves ``--feeds-per-host`` RSS feeds at ``/f/<n>.xml``. What a host does:

* **latency**: each answer waits a log-normal time, median ``--median-ms`` (150) and 99th
  percentile ``--p99-ms`` (2,000);
* **conditional requests**: a feed's ETag is the number of items it has had; a request
  whose ``If-None-Match`` is that gets 304 Not Modified;
* **faults**, drawn per request: ``--error-rate`` (1%) 500 or 503, ``--timeout-rate``
  (0.5%) an answer held for ``--hold-seconds`` (longer than any client's deadline);
  ``--limited-hosts`` (1%) of the hosts answer ``--limited-rate`` (20%) of requests with
  429 and ``Retry-After: 120``; ``--slow-hosts`` (0.5%) take ten times as long;
  ``--oversized-hosts`` (0.2%) send a feed padded past ``--oversized-bytes`` (20 MB);
* **items** appear on each feed as a Poisson process (``--items-per-hour`` per feed), the
  same for a given ``--seed``; a feed lists its newest 20. Each item carries one to
  three keywords from a vocabulary of ``--keywords`` words, drawn with Zipf-like weights,
  so that the simulator knows, apart from the pipeline, who must hear of it: the users
  whose filter names one of its keywords (``plan``, which a harness uses to make the
  users and their filters; ``--user-keywords uniform`` spreads their interests evenly,
  where Zipf's would have thousands follow the commonest words). A feed has had
  ``--history`` items before the start, on average, which its first answer lists.

The log (``--log``, JSON lines): one line per request (``"request"``: time, host, path,
status, latency, bytes; status 0: an answer the client gave up on, held or slow, logged then) and one per item when it appears (``"item"``: time, feed URL,
link, guid, keywords). ``--plan`` writes the sources and users a harness should create.

    .bench-venv/bin/pip install -r bench/requirements.txt   # aiohttp
    .bench-venv/bin/python bench/internet.py --hosts 2000 --log /tmp/internet.jsonl --plan /tmp/plan.json
    .bench-venv/bin/python bench/internet.py --smoke          # 20 hosts, a few requests, a report

Loopback only: every address it binds is in 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import hashlib
import ipaddress
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any, TextIO
from xml.sax.saxutils import escape

from aiohttp import web

LISTED = 20  # items a feed lists, newest first
FIRST_HOST = ipaddress.IPv4Address("127.1.0.1")


@dataclass(frozen=True)
class Settings:
    hosts: int = 2000
    feeds_per_host: int = 50
    port: int = 8080
    seed: int = 1
    items_per_hour: float = 1.0
    keywords: int = 5000
    users: int = 10000
    filters_per_user: int = 3
    median_ms: float = 150.0
    p99_ms: float = 2000.0
    error_rate: float = 0.01
    timeout_rate: float = 0.005
    hold_seconds: float = 120.0
    limited_hosts: float = 0.01
    limited_rate: float = 0.2
    slow_hosts: float = 0.005
    oversized_hosts: float = 0.002
    oversized_bytes: int = 20_000_000
    horizon_hours: float = 3.0  # how far ahead items are drawn
    # Items a feed has had before the start, on average (its first fetch lists them, up
    # to LISTED): at 100,000 feeds, 20 each is 2 million listings before the first minute.
    history: float = 20.0
    # How users choose the words they follow: "zipf" as items do (the common words
    # followed by thousands), or "uniform" (each word by about users x filters / keywords).
    user_keywords: str = "zipf"


def host_address(index: int) -> str:
    """The ``index``-th host's address: 127.1.0.1, 127.1.0.2, ... (never .0 or .255)."""
    third, fourth = divmod(index, 254)
    address = ipaddress.IPv4Address(int(FIRST_HOST) + third * 256 + fourth)
    assert address in ipaddress.IPv4Network("127.0.0.0/8"), address
    return str(address)


class World:
    """Everything the seed decides: each host's character, each feed's items and their
    keywords, each user's filters."""

    def __init__(self, settings: Settings, start: float) -> None:
        self.settings, self.start = settings, start
        rng = random.Random(settings.seed)
        n = settings.hosts
        self.limited = set(rng.sample(range(n), round(n * settings.limited_hosts)))
        self.slow = set(rng.sample(range(n), round(n * settings.slow_hosts)))
        self.oversized = set(rng.sample(range(n), round(n * settings.oversized_hosts)))
        # Zipf-like keyword weights: a few words are common, most are rare.
        self._weights = list(_cumulative([1.0 / (rank + 1) for rank in range(settings.keywords)]))
        self._items: dict[tuple[int, int], tuple[list[float], list[tuple[str, ...]]]] = {}
        # The log-normal latency: median m, 99th percentile p (z = 2.326).
        self.mu = math.log(settings.median_ms / 1000)
        self.sigma = math.log(settings.p99_ms / settings.median_ms) / 2.326

    def keyword(self, rng: random.Random) -> str:
        return f"kw{bisect.bisect_left(self._weights, rng.random() * self._weights[-1]):04d}"

    def items(self, host: int, feed: int) -> tuple[list[float], list[tuple[str, ...]]]:
        """The feed's items over the horizon: their appearance times (seconds after the
        start, ascending) and keywords."""
        key = (host, feed)
        if key not in self._items:
            rng = random.Random(f"{self.settings.seed}/{host}/{feed}")
            rate = self.settings.items_per_hour / 3600
            times: list[float] = []
            at = -rng.expovariate(rate) * self.settings.history  # a history before the start, as a real feed has
            horizon = self.settings.horizon_hours * 3600
            while at < horizon:
                times.append(at)
                at += rng.expovariate(rate)
            words = [tuple(sorted({self.keyword(rng) for _ in range(rng.randint(1, 3))})) for _ in times]
            self._items[key] = (times, words)
        return self._items[key]

    def latency(self, host: int, rng: random.Random) -> float:
        seconds = rng.lognormvariate(self.mu, self.sigma)
        return seconds * 10 if host in self.slow else seconds

    def plan(self) -> dict[str, Any]:
        """The sources and users a harness creates: every feed's URL, and each user's
        filters (one keyword each)."""
        s, rng = self.settings, random.Random(f"{self.settings.seed}/users")
        sources = [f"http://{host_address(h)}:{s.port}/f/{f}.xml" for h in range(s.hosts) for f in range(s.feeds_per_host)]
        if s.user_keywords not in ("zipf", "uniform"):
            raise SystemExit(f"--user-keywords {s.user_keywords!r} is not one of: zipf, uniform")

        def chosen() -> str:
            return self.keyword(rng) if s.user_keywords == "zipf" else f"kw{rng.randrange(s.keywords):04d}"

        users = [{"name": f"user{u:05d}", "keywords": sorted({chosen() for _ in range(s.filters_per_user)})}
                 for u in range(s.users)]
        return {"sources": sources, "users": users, "seed": s.seed}


def _gone(request: web.Request) -> bool:
    """The client closed the connection (gave up waiting)."""
    return request.transport is None or request.transport.is_closing()


def _cumulative(values: list[float]) -> list[float]:
    total, out = 0.0, []
    for v in values:
        total += v
        out.append(total)
    return out


@dataclass
class Log:
    """The run's record, one JSON object per line; items logged as they appear."""

    out: TextIO
    requests: int = 0
    statuses: dict[int, int] = field(default_factory=dict)

    def request(self, host: str, path: str, status: int, latency: float, size: int) -> None:
        self.requests += 1
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self._write({"kind": "request", "at": time.time(), "host": host, "path": path, "status": status,
                     "latency_ms": round(latency * 1000, 1), "bytes": size})

    def item(self, at: float, url: str, index: int, guid: str, keywords: tuple[str, ...]) -> None:
        self._write({"kind": "item", "at": at, "feed": url, "link": f"{url}?item={index}", "guid": guid,
                     "keywords": list(keywords)})

    def _write(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record) + "\n")


class Internet:
    """The hosts' one aiohttp application, bound once per host address."""

    def __init__(self, settings: Settings, log: Log) -> None:
        self.settings, self.log = settings, log
        self.world = World(settings, time.time())
        self.rng = random.Random(f"{settings.seed}/requests")
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        # Every feed's items drawn before the first request, not inside one (a draw of a
        # busy feed's items held the event loop past the clients' deadlines).
        for h in range(self.settings.hosts):
            for f in range(self.settings.feeds_per_host):
                self.world.items(h, f)
        app = web.Application()
        app.router.add_get("/f/{feed}.xml", self.feed)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        for h in range(self.settings.hosts):
            await web.TCPSite(self.runner, host_address(h), self.settings.port, backlog=64).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def feed(self, request: web.Request) -> web.StreamResponse:
        address = request.transport.get_extra_info("sockname")[0] if request.transport else "?"
        host = _host_index(address)
        s, rng, began = self.settings, self.rng, time.monotonic()
        await asyncio.sleep(self.world.latency(host, rng))
        status, body, headers = self._answer(request, host, address)
        if status == 0:  # a timeout: hold the answer past any client's deadline
            held_until = time.monotonic() + s.hold_seconds
            while time.monotonic() < held_until and not _gone(request):
                await asyncio.sleep(0.1)
            # Logged when the client gave up (status 0): the request was in flight, its
            # thread held, until then. Otherwise a 503 after the hold.
            status, body, headers = (0 if _gone(request) else 503), b"", {}
        elif _gone(request):
            # The client gave up while the answer waited its latency (a slow host's answer
            # past the client's deadline): it read nothing, as from a held answer. Logged
            # as its 200, the hour's audit counted lost an item whose only answer (21.9 s)
            # came after the collector's 20 s deadline.
            status, body = 0, b""
        self.log.request(address, request.path, status, time.monotonic() - began, len(body))
        return web.Response(status=status, body=body, headers=headers)

    def _answer(self, request: web.Request, host: int, address: str) -> tuple[int, bytes, dict[str, str]]:
        s, rng = self.settings, self.rng
        draw = rng.random()
        if draw < s.error_rate:
            return rng.choice((500, 503)), b"", {}
        if draw < s.error_rate + s.timeout_rate:
            return 0, b"", {}
        if host in self.world.limited and rng.random() < s.limited_rate:
            return 429, b"", {"Retry-After": "120"}
        try:
            feed = int(request.match_info["feed"])
        except ValueError:
            return 404, b"", {}
        if not 0 <= feed < s.feeds_per_host:
            return 404, b"", {}
        times, words = self.world.items(host, feed)
        now = time.time() - self.world.start
        count = bisect.bisect_right(times, now)
        etag = f'"{count}"'
        if request.headers.get("If-None-Match") == etag:
            return 304, b"", {"ETag": etag}
        url = f"http://{address}:{s.port}/f/{feed}.xml"
        body = _rss(url, [(i, times[i], words[i]) for i in range(count - 1, max(-1, count - 1 - LISTED), -1)],
                    self.world.start)
        if host in self.world.oversized:
            body += b"<!--" + b" " * s.oversized_bytes + b"-->"
        return 200, body, {"ETag": etag, "Content-Type": "application/rss+xml"}

    async def log_items(self, every: float = 1.0) -> None:
        """Log each item when it appears (its time, feed and keywords): the audit's truth."""
        s, logged = self.settings, 0.0
        while True:
            now = time.time() - self.world.start
            for h in range(s.hosts):
                address = host_address(h)
                for f in range(s.feeds_per_host):
                    times, words = self.world.items(h, f)
                    first, last = bisect.bisect_right(times, logged), bisect.bisect_right(times, now)
                    for i in range(max(first, 0), last):
                        if times[i] >= 0:
                            url = f"http://{address}:{s.port}/f/{f}.xml"
                            self.log.item(self.world.start + times[i], url, i, _guid(url, i), words[i])
            logged = now
            await asyncio.sleep(every)


def _host_index(address: str) -> int:
    offset = int(ipaddress.IPv4Address(address)) - int(FIRST_HOST)
    third, fourth = divmod(offset, 256)
    return third * 254 + fourth


def _guid(url: str, index: int) -> str:
    return hashlib.sha1(f"{url}#{index}".encode()).hexdigest()[:16]


# Syllables of the words that make each item's text its own: items that share keywords
# are still different stories (the pipeline sends one alert per story).
_SYLLABLES = ("ba", "ko", "ri", "tu", "me", "sa", "lo", "vi", "ne", "da", "po", "gu", "fe", "zi", "ha", "mo")


def _words_of(guid: str, n: int = 6) -> list[str]:
    """``n`` words drawn from the item's guid (16 hex digits: 64 bits), three syllables each."""
    bits = int(guid, 16)
    words = []
    for _ in range(n):
        word = ""
        for _ in range(3):
            bits, syllable = divmod(bits, len(_SYLLABLES))
            word += _SYLLABLES[syllable]
        words.append(word)
        bits = bits or int(hashlib.sha1(guid.encode() + word.encode()).hexdigest()[:16], 16)
    return words


def _rss(url: str, items: list[tuple[int, float, tuple[str, ...]]], start: float) -> bytes:
    """The feed's RSS 2.0 document: each item's title and description name its keywords,
    among words of its own."""
    parts = []
    for i, at, words in items:
        guid = _guid(url, i)
        own = _words_of(guid)
        parts.append(
            f"<item><title>{escape(' '.join(own[:3]))} {escape(' '.join(words))} #{i}</title>"
            f"<link>{escape(url)}?item={i}</link><guid isPermaLink=\"false\">{guid}</guid>"
            f"<description>{escape(' '.join(own[3:]).capitalize())}: about {escape(', '.join(words))}.</description>"
            f"<pubDate>{format_datetime(datetime.fromtimestamp(start + at, UTC))}</pubDate></item>"
        )
    return (f'<?xml version="1.0" encoding="utf-8"?><rss version="2.0"><channel><title>{escape(url)}</title>'
            f"<link>{escape(url)}</link><description>simulated</description>{''.join(parts)}</channel></rss>").encode()


async def serve(settings: Settings, log_path: Path | None, seconds: float | None) -> None:
    out = log_path.open("a", buffering=1) if log_path else sys.stdout
    internet = Internet(settings, Log(out))
    await internet.start()
    print(f"{settings.hosts} hosts on {host_address(0)}..{host_address(settings.hosts - 1)}:{settings.port},"
          f" {settings.hosts * settings.feeds_per_host} feeds", file=sys.stderr, flush=True)
    items = asyncio.create_task(internet.log_items())
    try:
        await (asyncio.sleep(seconds) if seconds else asyncio.Event().wait())
    finally:
        items.cancel()
        await internet.stop()


async def smoke() -> int:
    """20 hosts, every fault made likely, a few hundred requests: a report of what the
    simulator answered, and a check of its conditional requests (about 15 s: the held
    answers run out the client's deadline)."""
    import httpx

    settings = Settings(hosts=20, feeds_per_host=5, port=18080, median_ms=5, p99_ms=50, error_rate=0.05,
                        timeout_rate=0.02, hold_seconds=12, limited_hosts=0.2, slow_hosts=0.1,
                        oversized_hosts=0.05, oversized_bytes=100_000, items_per_hour=60)
    log = Log(open("/dev/null", "w"))
    internet = Internet(settings, log)
    await internet.start()
    try:
        # A deadline of 10 s (the held answers outlast it), none for a free connection.
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, pool=None)) as client:
            urls = internet.world.plan()["sources"]

            async def get(url: str, etag: str | None = None) -> tuple[int, str | None]:
                try:
                    answer = await client.get(url, headers={"If-None-Match": etag} if etag else {})
                    return answer.status_code, answer.headers.get("ETag")
                except httpx.TimeoutException:
                    return -1, None

            first = await asyncio.gather(*(get(u) for u in urls * 4))
            again = await asyncio.gather(*(get(u, e) for u, (code, e) in zip(urls * 4, first, strict=True)
                                           if code == 200))
    finally:
        await internet.stop()
    codes: dict[int, int] = {}
    for code, _ in [*first, *again]:
        codes[code] = codes.get(code, 0) + 1
    print(f"answers by status (-1: the client's timeout): {dict(sorted(codes.items()))}")
    print(f"conditional requests answered 304: {sum(1 for c, _ in again if c == 304)} of {len(again)}")
    return 0 if codes.get(200) and codes.get(304) and codes.get(429) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in Settings.__dataclass_fields__.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default.default), default=default.default)
    parser.add_argument("--log", type=Path, help="the JSON-lines log (default: stdout)")
    parser.add_argument("--plan", type=Path, help="write the sources and users a harness creates, then serve")
    parser.add_argument("--seconds", type=float, help="serve this long (default: until interrupted)")
    parser.add_argument("--smoke", action="store_true", help="20 hosts, a few hundred requests, a report")
    args = parser.parse_args()
    if args.smoke:
        return asyncio.run(smoke())
    settings = Settings(**{name: getattr(args, name) for name in Settings.__dataclass_fields__})
    if args.plan:
        args.plan.write_text(json.dumps(World(settings, time.time()).plan()))
    try:
        asyncio.run(serve(settings, args.log, args.seconds))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
