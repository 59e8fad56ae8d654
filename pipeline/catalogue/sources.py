"""The source catalogue: validating, adding, importing and steering sources.

Every entry is validated before anything is written: a rejected entry names itself and
what is wrong with it, and a file with any rejected entry writes nothing. Imports are
idempotent by URL.
"""

from __future__ import annotations

import csv
import io
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import sqlalchemy as sa
import yaml
from sqlalchemy.engine import Engine

from pipeline.catalogue.known import require_ids
from pipeline.core import politeness, redact
from pipeline.core.errors import QueryError, SourceError
from pipeline.core.inputs import NAME_CHARS, TEXT_CHARS, URL_CHARS, text_problem
from pipeline.core.kinds import EXPORT_FORMATS, SourceType
from pipeline.core.settings import Settings
from pipeline.core.urls import canonical_host, source_url
from pipeline.queue.spec import UNCLAIMED
from pipeline.storage import owners, politeness_groups, schema
from pipeline.storage.bulk import insert_ignoring_conflicts
from pipeline.storage.health import fetch_error, push_health

if TYPE_CHECKING:
    from pipeline.fetching.collector import CollectStats

# The fetching side (adapters, YouTube's URLs, WebSub, the collector) and the filters'
# compiler are imported by the functions that use them: listing or showing sources, the
# commands an operator runs most, loads none of it (tests/test_cli.py holds the budget).

# Bounds on an entry's adapter options (the other fields: pipeline/core/inputs.py).
CONFIG_CHARS = 64 * 1024
CONFIG_DEPTH = 16
# Config keys whose values are secrets: shown as "***" by `sources list`.
SECRET_KEYS = ("api_key", "secret", "token", "password")
IMPORT_CHUNK = 5_000  # sources per INSERT of an import


@dataclass(frozen=True)
class SourceSpec:
    """One source as a user describes it, validated and normalised."""

    url: str
    source_type: str
    name: str
    interval_minutes: int = schema.DEFAULT_FETCH_INTERVAL_MINUTES
    category: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    politeness_group: str = politeness.DEFAULT  # make_spec names it (politeness.group_for)
    priority: int = 0  # due sources are claimed highest priority first (schema.SOURCES_DUE)
    # Adaptive cadence (pipeline/core/cadence.py): the interval is learned within these
    # bounds (None: the settings' defaults).
    adaptive: bool = False
    min_interval_minutes: int | None = None
    max_interval_minutes: int | None = None
    owner: str | None = None  # a user's name: told when it fails (an import file's ``owner``)

    def row(self) -> dict[str, Any]:
        config = dict(self.config)
        if self.category:
            config["category"] = self.category
        return {
            "url": self.url,
            "source_type": self.source_type,
            "name": self.name,
            "fetch_interval_minutes": self.interval_minutes,
            "config": config,
            "politeness_group": self.politeness_group,
            "priority": self.priority,
            "adaptive_cadence": self.adaptive,
            "min_interval_minutes": self.min_interval_minutes,
            "max_interval_minutes": self.max_interval_minutes,
        }


def make_spec(
    url: str,
    *,
    source_type: str | None = None,
    name: str | None = None,
    interval: int | str | None = None,
    category: str | None = None,
    config: dict[str, Any] | str | None = None,
    politeness_group: str | None = None,
    group_by: str = "host",
    priority: int | str | None = None,
    adaptive: bool | str | None = None,
    min_interval: int | str | None = None,
    max_interval: int | str | None = None,
    adaptive_default: bool = False,
    entry: str = "",
) -> SourceSpec:
    """Validate one entry; ``entry`` names it in errors (e.g. "line 4 of feeds.csv").
    Its politeness group is ``politeness_group``, or named by ``group_by`` (host, domain).
    Its cadence is adaptive when ``adaptive`` says so, else when ``adaptive_default``
    (PIPELINE_ADAPTIVE_CADENCE) does."""
    from pipeline.fetching import youtube
    from pipeline.fetching.registry import adapter_for

    where = f"{entry}: " if entry else ""
    value = (url or "").strip()
    if not value:
        raise SourceError(f"{where}the URL is missing")
    if len(value) > URL_CHARS:
        raise SourceError(f"{where}the URL is {len(value):,} characters long; at most {URL_CHARS:,}")
    kind = (source_type or "").strip().lower() or None
    if kind is not None and kind not in list(SourceType):
        raise SourceError(
            f"{where}unknown source type {source_type!r}: use one of {', '.join(SourceType)}"
        )
    channel = youtube.youtube_url(value)
    if channel is not None and kind in (None, SourceType.YOUTUBE):
        value, kind = channel, SourceType.YOUTUBE
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:  # a port out of range, a malformed IPv6 literal
        raise SourceError(f"{where}{value!r} is not a usable URL: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise SourceError(f"{where}{value!r} is not an http(s) URL")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise SourceError(f"{where}{value!r} contains white space or control characters")
    if canonical_host(parts.hostname) is None:
        raise SourceError(f"{where}{value!r}: {parts.hostname!r} is not a host name or an IP address")
    if port == 0:
        raise SourceError(f"{where}{value!r}: port 0 is not a port")
    # One feed, one source: HTTP://Host:80/feed?utm_source=x#top is http://host/feed
    # (pipeline/core/urls.py: canonical, without tracking parameters).
    value = source_url(value)
    parts = urlsplit(value)
    if kind is None:
        kind = SourceType.YOUTUBE if parts.hostname in youtube.YOUTUBE_HOSTS else SourceType.RSS
    if kind == SourceType.YOUTUBE:
        try:
            youtube.parse_target(value)
        except ValueError as exc:
            raise SourceError(f"{where}{exc}") from None
    minutes = _interval(interval, where)
    spec = SourceSpec(
        url=value,
        source_type=kind,
        name=_text(name, "name", where) or redact.userinfo(value),  # never a password
        interval_minutes=minutes,
        category=_text(category, "category", where) or None,
        config=_config(config, where),
        politeness_group=politeness.group_for(
            value, kind, _text(politeness_group, "group", where, NAME_CHARS) or None, by=group_by
        ),
        priority=check_priority(priority, where),
        **check_cadence(adaptive, min_interval, max_interval, default=adaptive_default, where=where),
    )
    try:
        adapter_for(kind).check_config(spec.row()["config"])
    except ValueError as exc:
        raise SourceError(f"{where}{exc}") from None
    return spec


def _text(value: object, field: str, where: str, limit: int = TEXT_CHARS) -> str:
    """A short text field of an entry, stripped; SourceError naming the field when
    pipeline/core/inputs.py does not accept it."""
    if value is None:
        return ""
    text = str(value).strip()
    problem = text_problem(text, field, limit)
    if problem:
        raise SourceError(f"{where}{problem}")
    return text


def _config(config: dict[str, Any] | str | None, where: str) -> dict[str, Any]:
    """The adapter options of an entry: a mapping, or JSON text of one, flat enough and
    clean enough to store (no control characters in its text, at most CONFIG_DEPTH deep)."""
    if config is None or (isinstance(config, str) and not config.strip()):
        return {}
    if isinstance(config, str):
        if len(config) > CONFIG_CHARS:
            raise SourceError(f"{where}config is {len(config):,} characters long; at most {CONFIG_CHARS:,}")
        try:
            config = json.loads(config)
        except RecursionError:
            raise SourceError(f"{where}config is nested too deeply (at most {CONFIG_DEPTH} levels)") from None
        except ValueError as exc:
            raise SourceError(f"{where}config is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise SourceError(f"{where}config must be a JSON object (a mapping of options)")
    _check_config_values(config, where)
    return dict(config)


def _check_config_values(config: dict[str, Any], where: str) -> None:
    """Walk ``config`` (without recursion, so no depth can overflow the stack)."""
    stack: list[tuple[Any, int]] = [(config, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > CONFIG_DEPTH:
            raise SourceError(f"{where}config is nested too deeply (at most {CONFIG_DEPTH} levels)")
        if isinstance(value, dict):
            for key, item in value.items():
                stack.extend([(key, depth), (item, depth + 1)])
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str) and (problem := text_problem(value, "config", CONFIG_CHARS)):
            raise SourceError(f"{where}{problem}")


def is_secret(key: str) -> bool:
    """Is an adapter option named ``key`` a secret (SECRET_KEYS: an API key, a token...)?"""
    return any(word in key.lower() for word in SECRET_KEYS)


def public_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """``config`` with secret values (API keys and the like) hidden, for display."""
    return {key: "***" if is_secret(key) else value for key, value in (config or {}).items()}


def check_priority(priority: int | str | None, where: str = "") -> int:
    """A source's priority: a whole number from MIN_PRIORITY to MAX_PRIORITY, 0 when
    none is given; SourceError saying what is wrong otherwise."""
    if priority is None or (isinstance(priority, str) and not priority.strip()):
        return 0
    if isinstance(priority, bool):  # YAML's yes/no: a number was meant
        raise SourceError(f"{where}priority {priority!r} is not a whole number")
    try:
        value = int(priority)
    except (TypeError, ValueError):
        raise SourceError(f"{where}priority {priority!r} is not a whole number") from None
    if not schema.MIN_PRIORITY <= value <= schema.MAX_PRIORITY:
        raise SourceError(f"{where}priority {value} is out of bounds: it must be "
                          f"{schema.MIN_PRIORITY} to {schema.MAX_PRIORITY}")
    return value


def _interval(interval: int | str | None, where: str, what: str = "interval") -> int:
    if interval is None or (isinstance(interval, str) and not interval.strip()):
        return schema.DEFAULT_FETCH_INTERVAL_MINUTES
    if isinstance(interval, bool):
        raise SourceError(f"{where}{what} {interval!r} is not a whole number of minutes")
    try:
        minutes = int(interval)
    except (TypeError, ValueError):
        raise SourceError(f"{where}{what} {interval!r} is not a whole number of minutes") from None
    low, high = schema.MIN_FETCH_INTERVAL_MINUTES, schema.MAX_FETCH_INTERVAL_MINUTES
    if not low <= minutes <= high:
        raise SourceError(
            f"{where}{what} {minutes} is out of bounds: it must be {low} to {high} minutes"
        )
    return minutes


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


_YES, _NO = ("true", "yes", "on", "1", "adaptive"), ("false", "no", "off", "0", "fixed")


def check_cadence(
    adaptive: bool | str | None, min_interval: int | str | None, max_interval: int | str | None,
    *, default: bool = False, where: str = "",
) -> dict[str, Any]:
    """A source's cadence as SourceSpec fields: adaptive or not (``default`` when not
    said), and the bounds of an adaptive one (each 1 to 10080 minutes, min <= max);
    SourceError saying what is wrong otherwise."""
    if _blank(adaptive):
        on = default
    elif isinstance(adaptive, bool):
        on = adaptive
    elif str(adaptive).strip().lower() in _YES + _NO:
        on = str(adaptive).strip().lower() in _YES
    else:
        raise SourceError(f"{where}adaptive {adaptive!r}: use true or false")
    low = None if _blank(min_interval) else _interval(min_interval, where, "min interval")
    high = None if _blank(max_interval) else _interval(max_interval, where, "max interval")
    if not on and (low is not None or high is not None):
        raise SourceError(f"{where}a min or max interval bounds an adaptive cadence: this source's is fixed")
    if low is not None and high is not None and low > high:
        raise SourceError(f"{where}min interval {low} is more than max interval {high}")
    return {"adaptive": on, "min_interval_minutes": low, "max_interval_minutes": high}


# -- files --------------------------------------------------------------------------------


def read_source_file(path: Path, *, group_by: str = "host", adaptive_default: bool = False) -> list[SourceSpec]:
    """Every entry of an OPML, YAML or CSV file, validated; SourceError names bad ones.
    An entry's ``group`` names its politeness group; else ``group_by`` does. An entry's
    ``adaptive`` says its cadence; else ``adaptive_default`` does."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise SourceError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: cannot be read: {exc}") from None
    suffix = path.suffix.lower()
    if suffix in (".opml", ".xml"):
        return _from_opml(text, path.name, group_by, adaptive_default)
    if suffix in (".yaml", ".yml"):
        return _from_yaml(text, path.name, group_by, adaptive_default)
    if suffix == ".csv":
        return _from_csv(text, path.name, group_by, adaptive_default)
    raise SourceError(f"{path}: unknown file type {suffix!r}: use .opml, .yaml or .csv")


def _collect(
    entries: Iterable[tuple[str, dict[str, Any]]], file: str, group_by: str, adaptive_default: bool
) -> list[SourceSpec]:
    """Validate every entry, reporting all the bad ones at once."""
    specs, problems = [], []
    for entry, fields in entries:
        try:
            specs.append(
                make_spec(
                    fields.get("url") or "",
                    source_type=fields.get("type"),
                    name=fields.get("name"),
                    interval=fields.get("interval"),
                    category=fields.get("category"),
                    config=fields.get("config"),
                    politeness_group=fields.get("group"),
                    group_by=group_by,
                    priority=fields.get("priority"),
                    adaptive=fields.get("adaptive"),
                    min_interval=fields.get("min_interval"),
                    max_interval=fields.get("max_interval"),
                    adaptive_default=adaptive_default,
                    entry=entry,
                )
            )
            owner = _text(fields.get("owner"), "owner", f"{entry}: " if entry else "", NAME_CHARS) or None
            if owner is not None:
                specs[-1] = replace(specs[-1], owner=owner)
        except SourceError as exc:
            problems.append(str(exc))
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise SourceError(f"{file}: nothing imported: " + "; ".join(problems[:5]) + more)
    if not specs:
        raise SourceError(f"{file}: no sources found")
    return specs


def _from_opml(text: str, file: str, group_by: str, adaptive_default: bool) -> list[SourceSpec]:
    # No DTDs at all: an OPML file never needs one, and refusing them rules out entity
    # expansion (the "billion laughs") whatever the XML parser would allow.
    if re.search(r"<!(DOCTYPE|ENTITY)", text, re.IGNORECASE):
        raise SourceError(f"{file}: OPML with a DOCTYPE or ENTITY declaration is not accepted")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise SourceError(f"{file}: not valid OPML: {exc}") from None
    body = root.find("body")
    if root.tag != "opml" or body is None:
        raise SourceError(f"{file}: not OPML (no <opml><body>)")
    entries: list[tuple[str, dict[str, Any]]] = []
    # Outlines in document order, without recursion (folders may nest thousands deep):
    # a folder's outlines take its title as their category.
    stack: list[tuple[ET.Element, str | None]] = [(child, None) for child in reversed(body.findall("outline"))]
    while stack:
        child, category = stack.pop()
        label = child.get("title") or child.get("text")
        url = child.get("xmlUrl") or child.get("xmlurl")
        if url is None and child.get("url"):
            url = child.get("url")
        if url is None:
            stack.extend((inner, label or category) for inner in reversed(child.findall("outline")))
            continue
        kind = (child.get("type") or "").lower()
        entries.append(
            (
                f"{file}, outline {label or url!r}",
                {
                    "url": url,
                    "type": kind if kind in list(SourceType) else None,
                    "name": label,
                    "category": child.get("category") or category,
                    "interval": child.get("interval"),
                    "group": child.get("group"),
                    "config": child.get("config"),
                    "priority": child.get("priority"),
                    "adaptive": child.get("adaptive"),
                    "min_interval": child.get("min_interval"),
                    "max_interval": child.get("max_interval"),
                    "owner": child.get("owner"),
                },
            )
        )
    return _collect(entries, file, group_by, adaptive_default)


# How deep a YAML import may nest (a source's config is at most CONFIG_DEPTH levels, under
# an entry of a list under ``sources:``): bounded while the document is composed, before
# PyYAML's recursive composer could overflow the stack.
YAML_DEPTH = CONFIG_DEPTH + 4


class _ImportLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (a 546-byte document of nested aliases is a
    billion nodes: the "billion laughs") and with a bound on nesting. A list of sources
    needs neither."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{event.anchor}) are not accepted in an import", event.start_mark)
        self._depth += 1
        try:
            if self._depth > YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {YAML_DEPTH} levels deep", self.peek_event().start_mark)  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _from_yaml(text: str, file: str, group_by: str, adaptive_default: bool) -> list[SourceSpec]:
    try:
        data = yaml.load(text, Loader=_ImportLoader)  # noqa: S506 (a safe loader, without aliases)
    except yaml.YAMLError as exc:
        raise SourceError(f"{file}: not valid YAML: {' '.join(str(exc).split())}") from None
    if isinstance(data, dict) and "sources" in data:
        data = data["sources"]
    if not isinstance(data, list):
        raise SourceError(f"{file}: expected a list of sources (or a 'sources:' key)")
    entries = []
    for number, item in enumerate(data, start=1):
        entry = f"{file}, entry {number}"
        if isinstance(item, str):
            item = {"url": item}
        if not isinstance(item, dict):
            raise SourceError(f"{entry}: expected a URL or a mapping, got {type(item).__name__}")
        entries.append((entry, item))
    return _collect(entries, file, group_by, adaptive_default)


def _from_csv(text: str, file: str, group_by: str, adaptive_default: bool) -> list[SourceSpec]:
    reader = csv.DictReader(io.StringIO(text))
    fields = [f.strip().lower() for f in reader.fieldnames or []]
    if "url" not in fields:
        raise SourceError(
            f"{file}: the header must name a 'url' column"
            " (and optionally type, name, interval, category, config, group, priority, adaptive,"
            " min_interval, max_interval)"
        )
    reader.fieldnames = fields
    try:
        entries = [
            (f"{file}, line {reader.line_num}", {k: (v or "").strip() for k, v in row.items() if k})
            for row in reader
        ]
    except csv.Error as exc:  # a field past the csv module's limit, a NUL in a field
        raise SourceError(f"{file}, line {reader.line_num + 1}: not valid CSV: {exc}") from None
    return _collect(entries, file, group_by, adaptive_default)


# What an export writes, in the import's field names and order (``_collect`` reads them).
EXPORT_FIELDS = ("url", "type", "name", "interval", "category", "group", "priority", "adaptive",
                 "min_interval", "max_interval", "owner", "config")


@dataclass(frozen=True)
class Export:
    entries: list[dict[str, Any]]  # one per source, in id order; fields of EXPORT_FIELDS
    without_secrets: int  # sources whose URL password or secret options were left out


def export_sources(conn: sa.Connection, *, secrets: bool = False) -> Export:
    """Every source as an entry of an import file, so that importing what ``write_sources``
    makes of them adds the same sources (URL, type, name, interval, category, politeness
    group, priority, cadence, owner's name, options). Without ``secrets``, a URL's user
    info and the options named like secrets (SECRET_KEYS) are left out. Not exported:
    whether a source is enabled, its health and its history."""
    t, o, u = schema.sources, schema.source_owners, schema.users
    rows = conn.execute(sa.select(
        t.c.url, t.c.source_type, t.c.name, t.c.fetch_interval_minutes, t.c.config, t.c.politeness_group,
        t.c.priority, t.c.adaptive_cadence, t.c.min_interval_minutes, t.c.max_interval_minutes,
        u.c.name.label("owner"),
    ).select_from(t.outerjoin(o, o.c.source_id == t.c.id).outerjoin(u, u.c.id == o.c.user_id)).order_by(t.c.id))
    entries, without = [], 0
    for row in rows:
        config = dict(row.config or {})
        category = config.pop("category", None)
        url = row.url
        if not secrets:
            hidden = [key for key in config if is_secret(key)]
            parts = urlsplit(url)
            if hidden or parts.username is not None or parts.password is not None:
                without += 1
                config = {key: value for key, value in config.items() if key not in hidden}
                url = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        entry = {
            "url": url, "type": row.source_type, "name": row.name, "interval": row.fetch_interval_minutes,
            "category": category, "group": row.politeness_group, "priority": row.priority or None,
            "adaptive": row.adaptive_cadence, "min_interval": row.min_interval_minutes,
            "max_interval": row.max_interval_minutes, "owner": row.owner, "config": config or None,
        }
        entries.append({key: value for key, value in entry.items() if value is not None})
    return Export(entries, without)


def write_sources(entries: Sequence[dict[str, Any]], form: str) -> str:
    """``entries`` (``export_sources``) as the text of an OPML, YAML or CSV file that
    ``read_source_file`` reads back."""
    if form == "yaml":
        return str(yaml.safe_dump({"sources": list(entries)}, sort_keys=False, allow_unicode=True))
    if form == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=EXPORT_FIELDS, lineterminator="\n")
        writer.writeheader()
        for entry in entries:
            writer.writerow({key: _flat(value) for key, value in entry.items()})
        return out.getvalue()
    if form == "opml":
        root = ET.Element("opml", version="2.0")
        ET.SubElement(ET.SubElement(root, "head"), "title").text = "pipeline sources"
        body = ET.SubElement(root, "body")
        for entry in entries:
            attributes = {"text": entry["name"], "title": entry["name"], "xmlUrl": entry["url"]}
            attributes |= {key: _flat(value) for key, value in entry.items() if key not in ("url", "name")}
            ET.SubElement(body, "outline", attributes)
        ET.indent(root)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
    raise SourceError(f"unknown format {form!r}: use one of {', '.join(EXPORT_FORMATS)}")


def _flat(value: object) -> str:
    """A field's value as a CSV cell or an OPML attribute: options as JSON."""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# -- the catalogue --------------------------------------------------------------------------


def add_source(conn: sa.Connection, spec: SourceSpec) -> int:
    t = schema.sources
    existing = conn.execute(sa.select(t.c.id).where(t.c.url == spec.url)).scalar()
    if existing is not None:
        raise SourceError(f"a source with URL {spec.url} exists already (id {existing})")
    row = spec.row()
    politeness_groups.ensure_groups(conn, [row["politeness_group"]])
    return int(conn.execute(sa.insert(t).values(row).returning(t.c.id)).scalar_one())


@dataclass(frozen=True)
class ImportResult:
    added: int
    present: int


def owner_ids(conn: sa.Connection, specs: Sequence[SourceSpec]) -> dict[str, int]:
    """The id of the user each of ``specs`` names as its owner, by the source's URL;
    SourceError, naming the first missing one and a source it owns, when one is not a
    user."""
    owned = {spec.url: spec.owner for spec in specs if spec.owner}
    if not owned:
        return {}
    users = schema.users
    known = {name: user_id for name, user_id in conn.execute(
        sa.select(users.c.name, users.c.id).where(users.c.name.in_(set(owned.values()))))}
    if missing := sorted(set(owned.values()) - set(known)):
        raise SourceError(f"nothing imported: no user named {missing[0]!r}, owner of "
                          + next(url for url, name in owned.items() if name == missing[0]))
    return {url: known[name] for url, name in owned.items()}


def import_sources(
    conn: sa.Connection, specs: Sequence[SourceSpec], *, progress: Callable[[int], None] | None = None
) -> ImportResult:
    """Insert the sources whose URL is new, each new one owned by its ``owner`` (a user
    who must exist: one who does not rejects the file); the rest are left as they are.
    Rows go in chunks (all in ``conn``'s transaction); ``progress`` is told each chunk's
    size."""
    unique = list({spec.url: spec for spec in reversed(specs)}.values())[::-1]
    owned = owner_ids(conn, unique)
    existing = set(conn.execute(sa.select(schema.sources.c.url).where(schema.sources.c.url.in_(list(owned))))
                   .scalars()) if owned else set()
    added = 0
    for start in range(0, len(unique), IMPORT_CHUNK):
        rows = [spec.row() for spec in unique[start : start + IMPORT_CHUNK]]
        politeness_groups.ensure_groups(conn, [row["politeness_group"] for row in rows])
        added += insert_ignoring_conflicts(conn, schema.sources, rows, ["url"])
        if progress is not None:
            progress(len(rows))
    new_owned = {url: user_id for url, user_id in owned.items() if url not in existing}
    if new_owned:
        t = schema.sources
        for source_id, url in conn.execute(sa.select(t.c.id, t.c.url).where(t.c.url.in_(list(new_owned)))):
            owners.set_owner(conn, source_id, new_owned[url])
    return ImportResult(added=added, present=len(unique) - added)


def list_sources(
    conn: sa.Connection, *, source_id: int | None = None, more: Sequence[sa.Column[Any]] = ()
) -> list[dict[str, Any]]:
    """Every source (or the one ``source_id`` names) with its schedule and health, and
    the columns ``more`` names."""
    t = schema.sources
    columns = [
        t.c.id, t.c.name, t.c.url, t.c.source_type, t.c.enabled, t.c.fetch_interval_minutes,
        t.c.next_fetch_at, t.c.last_success_at, t.c.consecutive_failures,
        t.c.last_failure_reason, t.c.disabled_reason, t.c.priority, t.c.politeness_group, t.c.config,
        t.c.adaptive_cadence, t.c.min_interval_minutes, t.c.max_interval_minutes, *more,
    ]
    query = sa.select(*columns).order_by(t.c.id)
    if source_id is not None:
        query = query.where(t.c.id == source_id)
    rows = [dict(r) for r in conn.execute(query).mappings()]
    for row in rows:
        row["config"] = public_config(row["config"])
        # Shown, never with a password (a name was the URL by default before it was masked).
        row["url"], row["name"] = redact.userinfo(row["url"]), redact.userinfo(row["name"])
    return rows


SHOWN_RECENT = 5  # the items and fetches `sources show` lists


def show_source(conn: sa.Connection, source_id: int) -> dict[str, Any]:
    """One source as `sources show` tells it: its row (as ``list_sources`` gives it, with
    its site and last fetch), how many listings it has, its latest listings and its
    latest completed fetches with their outcome (each read by an index)."""
    t, listings, events = schema.sources, schema.listings, schema.ingestion_events
    found = list_sources(conn, source_id=source_id, more=(t.c.last_fetched_at, t.c.site_url))
    if not found:
        raise SourceError(f"no source with id {source_id}")
    source = found[0]
    source["listings"] = conn.execute(
        sa.select(sa.func.count()).select_from(listings).where(listings.c.source_id == source_id)).scalar_one()
    source["recent_listings"] = [dict(r) for r in conn.execute(
        sa.select(listings.c.id, listings.c.title, listings.c.url, listings.c.ingested_at)
        .where(listings.c.source_id == source_id).order_by(listings.c.id.desc()).limit(SHOWN_RECENT)).mappings()]
    source["recent_fetches"] = [dict(r) for r in conn.execute(
        sa.select(events.c.occurred_at, events.c.success, events.c.failure_reason, events.c.http_status,
                  events.c.items_seen, events.c.items_new, events.c.duration_ms, events.c.details)
        .where(events.c.source_id == source_id, events.c.event == schema.EVENT_COMPLETED)
        .order_by(events.c.occurred_at.desc()).limit(SHOWN_RECENT)).mappings()]
    for fetch in source["recent_fetches"]:
        fetch["error"] = fetch_error(fetch.pop("details"))
    source["owner"] = owner_of(conn, source_id)
    w = schema.websub_subscriptions
    pushed = conn.execute(sa.select(w.c.hub, w.c.state, w.c.lease_until, w.c.due_at, w.c.pushes, w.c.last_push_at,
                                    w.c.missed, w.c.missed_at, w.c.last_error,
                                    push_health(w, datetime.now(UTC)).label("health"))
                          .where(w.c.source_id == source_id)).mappings().first()
    source["websub"] = None if pushed is None else dict(pushed)
    return source


def set_owner(conn: sa.Connection, source_id: int, user: str | None) -> int | None:
    """``user`` (a name or id) owns the source from now on, told when it starts failing
    and when it recovers (pipeline/storage/owners.py); None: nobody does. The owner's id."""
    from pipeline.catalogue.users import find_user

    require_ids(conn, schema.sources, [source_id], "source", SourceError)
    user_id = None if user is None else find_user(conn, user)
    owners.set_owner(conn, source_id, user_id)
    return user_id


def owner_of(conn: sa.Connection, source_id: int) -> dict[str, Any] | None:
    """The source's owner (name, since when they were told it fails), or None."""
    o, u = schema.source_owners, schema.users
    row = conn.execute(sa.select(u.c.id, u.c.name, o.c.alerted_at).join(u, u.c.id == o.c.user_id)
                       .where(o.c.source_id == source_id)).mappings().first()
    return None if row is None else dict(row)


def _update_source(conn: sa.Connection, source_id: int, **values: Any) -> None:
    t = schema.sources
    if conn.execute(sa.update(t).where(t.c.id == source_id).values(**values)).rowcount == 0:
        raise SourceError(f"no source with id {source_id}")


def enable_source(conn: sa.Connection, source_id: int) -> None:
    """Enable, forget the failure streak, and make it due now (a fetch in flight is
    fenced out: see ``refresh_source``)."""
    _update_source(
        conn, source_id, enabled=True, disabled_reason=None, consecutive_failures=0,
        next_fetch_at=None, attempts=0, **UNCLAIMED,
    )


def set_source(conn: sa.Connection, source_id: int, *, priority: int | str | None = None,
               interval: int | str | None = None, adaptive: bool | None = None,
               min_interval: int | str | None = None, max_interval: int | str | None = None,
               name: str | None = None, url: str | None = None, category: str | None = None,
               config: dict[str, Any] | str | None = None, group: str | None = None,
               group_by: str = "host") -> None:
    """Change a source's priority, fetch interval and/or cadence (validated as
    ``make_spec`` does, the bounds together with those the source keeps), and its name,
    URL, category, options or politeness group (``_described``). A new interval applies
    from the next fetch on: ``next_fetch_at`` is left as it is."""
    values: dict[str, Any] = _described(conn, source_id, name=name, url=url, category=category, config=config,
                                        group=group, group_by=group_by)
    if priority is not None:
        values["priority"] = check_priority(priority)
    if interval is not None:
        values["fetch_interval_minutes"] = _interval(interval, "")
    if adaptive is not None or min_interval is not None or max_interval is not None:
        t = schema.sources
        row = conn.execute(
            sa.select(t.c.adaptive_cadence, t.c.min_interval_minutes, t.c.max_interval_minutes)
            .where(t.c.id == source_id)
        ).first()
        if row is None:
            raise SourceError(f"no source with id {source_id}")
        keep = adaptive is not False  # a fixed cadence keeps no bounds but those given
        cadence = check_cadence(
            row.adaptive_cadence if adaptive is None else adaptive,
            row.min_interval_minutes if min_interval is None and keep else min_interval,
            row.max_interval_minutes if max_interval is None and keep else max_interval,
        )
        values.update(adaptive_cadence=cadence["adaptive"], min_interval_minutes=cadence["min_interval_minutes"],
                      max_interval_minutes=cadence["max_interval_minutes"])
    if not values:
        raise SourceError("nothing to set: give --name, --url, --category, --config, --group, --priority,"
                          " --interval, --adaptive/--fixed, --min-interval or --max-interval")
    _update_source(conn, source_id, **values)


def _described(conn: sa.Connection, source_id: int, *, name: str | None, url: str | None, category: str | None,
               config: dict[str, Any] | str | None, group: str | None, group_by: str) -> dict[str, Any]:
    """The columns that change when a source's name, URL, category, options or group
    are given, validated as ``make_spec`` validates a new source's (an empty name or
    category: none). Its id stays, and with it its items, fetch history, owner and
    WebSub subscription (asked again at the next fetch when the hub or topic moved).
    A new URL another source has is refused; the politeness group follows the new URL's
    host unless the source had a group of its own or ``group`` is given."""
    if name is None and url is None and category is None and config is None and group is None:
        return {}
    t = schema.sources
    row = conn.execute(sa.select(t.c.url, t.c.source_type, t.c.name, t.c.config, t.c.politeness_group)
                       .where(t.c.id == source_id)).first()
    if row is None:
        raise SourceError(f"no source with id {source_id}")
    options = dict(row.config or {})
    kept_category = options.pop("category", None)
    own_group = row.politeness_group != politeness.group_for(row.url, row.source_type, None, by=group_by)
    spec = make_spec(
        row.url if url is None else url, source_type=row.source_type,
        name=(None if row.name == redact.userinfo(row.url) else row.name) if name is None else name,
        category=kept_category if category is None else category,
        config=options if config is None else config,
        politeness_group=group if group is not None else row.politeness_group if own_group else None,
        group_by=group_by,
    ).row()
    if spec["url"] != row.url:
        other = conn.execute(sa.select(t.c.id).where(t.c.url == spec["url"], t.c.id != source_id)).scalar()
        if other is not None:
            raise SourceError(f"source {other} has URL {spec['url']} already")
    changed = {key: spec[key] for key in ("url", "name", "config", "politeness_group")
               if spec[key] != getattr(row, key)}
    if "politeness_group" in changed:
        politeness_groups.ensure_groups(conn, [changed["politeness_group"]])
    return changed


def disable_source(conn: sa.Connection, source_id: int, reason: str = "disabled by an operator") -> None:
    """Fetch the source no more; its WebSub hub is asked to stop pushing."""
    from pipeline.fetching import websub

    _update_source(conn, source_id, enabled=False, disabled_reason=reason)
    websub.end(conn, [source_id])


def remove_sources(conn: sa.Connection, source_ids: Sequence[int]) -> dict[str, int]:
    """Delete sources with everything they brought: their raw rows and listings, the
    notifications of those listings (sent or not: a removed source alerts no more), their
    fetch events, and the filters scoped to them. All or nothing: an id that names no
    source is an error and nothing is deleted. Returns how many of each were deleted.
    A fetch in flight is fenced out: it finds its source gone and stores nothing."""
    from pipeline.fetching import websub

    t, f, li, n = schema.sources, schema.filters, schema.listings, schema.notifications
    require_ids(conn, t, source_ids, "source", SourceError)
    ids = sorted(set(source_ids))
    counts = {
        "sources": len(ids),
        "listings": conn.execute(sa.select(sa.func.count()).where(li.c.source_id.in_(ids))).scalar_one(),
        "notifications": conn.execute(sa.select(sa.func.count()).select_from(n.join(li, li.c.id == n.c.listing_id))
                                      .where(li.c.source_id.in_(ids))).scalar_one(),
        "filters": conn.execute(sa.select(sa.func.count()).where(f.c.source_id.in_(ids))).scalar_one(),
    }
    websub.end(conn, ids, removed=True)  # its hub is asked to stop pushing
    # The raw rows first, in the order the processor locks them (its raw rows, then, for
    # a listing's foreign key, the source): deleting the source first took them the other
    # way round, and a processor working on them deadlocked with the removal.
    conn.execute(sa.delete(schema.listings_raw).where(schema.listings_raw.c.source_id.in_(ids)))
    conn.execute(sa.delete(t).where(t.c.id.in_(ids)))  # the rest by ON DELETE CASCADE
    ended = _filters_only_from(conn, ids)
    conn.execute(sa.delete(f).where(f.c.id.in_(ended)))
    counts["filters"] += len(ended)
    return counts


def _filters_only_from(conn: sa.Connection, source_ids: Sequence[int]) -> list[int]:
    """The filters whose query can match only listings of ``source_ids`` (``source:12``
    in every alternative: ``query.only_from``), which end with those sources as filters
    scoped to them (``--source``) do. Ids are never given twice (schema ``_id``), so a
    filter left naming one would match nothing for ever; it went on to follow a new
    source given the id on SQLite. Read after the sources are gone (names resolved
    without them)."""
    from pipeline.notify.notifier import source_ids_by_name
    from pipeline.notify.query import compile_query, only_from

    f = schema.filters
    found = conn.execute(sa.select(f.c.id, f.c.query).where(sa.func.lower(f.c.query).like("%source:%"))).all()
    if not found:
        return []
    names = source_ids_by_name(conn)
    ended = []
    for filter_id, text in found:
        try:
            if only_from(compile_query(text, names), source_ids):
                ended.append(filter_id)
        except QueryError:
            continue  # a filter that no longer compiles is the notifier's to report
    return ended


def refresh_source(conn: sa.Connection, source_id: int) -> None:
    """Make the source due now (NULL next_fetch_at sorts first among due sources).

    A fetch in flight is fenced out (its claim is cleared, ``claim.UNCLAIMED``): its
    result is discarded and the source is fetched afresh, so a refresh is never
    overwritten by the schedule of a fetch that started before it."""
    _update_source(conn, source_id, next_fetch_at=None, attempts=0, **UNCLAIMED)


def refresh_sources(conn: sa.Connection, source_ids: Sequence[int]) -> list[int]:
    """Make the enabled sources among ``source_ids`` due now, as ``refresh_source``
    does; the ids made due (the others are disabled). An id that names no source is an
    error, and nothing is made due."""
    t = schema.sources
    require_ids(conn, t, source_ids, "source", SourceError)
    chosen = (t.c.id.in_(list(source_ids)), t.c.enabled)
    refresh = sa.update(t).values(next_fetch_at=None, attempts=0, **UNCLAIMED)
    if conn.dialect.update_returning:
        return sorted(conn.execute(refresh.where(*chosen).returning(t.c.id)).scalars())
    # MariaDB (no UPDATE ... RETURNING): lock the rows chosen, then make those due.
    ids = sorted(conn.execute(sa.select(t.c.id).where(*chosen).with_for_update()).scalars())
    if ids:
        conn.execute(refresh.where(t.c.id.in_(ids)))
    return ids


def refetch_sources(
    engine: Engine, settings: Settings, source_ids: Sequence[int], *, worker: str, run_id: str | None = None
) -> tuple[list[int], CollectStats]:
    """The re-fetch backfill (the `refetch_sources` job, `pipeline backfill refetch`): make
    the enabled sources among ``source_ids`` due now, then run a collector pass. Returns
    the ids made due (the others are disabled) and the pass's totals; SourceError, and
    nothing done, when an id names no source."""
    from pipeline.fetching.collector import Collector

    with engine.begin() as conn:
        due = refresh_sources(conn, source_ids)
    return due, Collector(engine, settings, worker=worker, run_id=run_id).run()
