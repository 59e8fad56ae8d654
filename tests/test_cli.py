"""The `pipeline` command as a user runs it: a separate process, settings from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

from pipeline import db, schema
from tests.helpers import add_raw_rows, add_source, now


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PIPELINE_STATE_DIR")}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_embedded_default_creates_a_sqlite_file_in_the_state_folder(tmp_path: Path):
    state = tmp_path / "state"
    result = run("db", "upgrade", env={"PIPELINE_STATE_DIR": str(state)})
    assert result.returncode == 0, result.stderr
    assert (state / "pipeline.db").exists()
    assert f"is at schema revision {db.head_revision()}" in result.stdout
    status = run("status", "--json", env={"PIPELINE_STATE_DIR": str(state)})
    assert status.returncode == 0, status.stderr
    assert {t["table"] for t in json.loads(status.stdout)["tables"]} == set(schema.metadata.tables)


def test_the_default_state_folder_is_git_ignored():
    root = Path(__file__).resolve().parent.parent
    assert ".state/" in (root / ".gitignore").read_text().splitlines()


def test_status_counts_rows_claims_in_flight_and_expired_leases(engine, db_url):
    t = schema.listings_raw
    with engine.begin() as conn:
        ids = add_raw_rows(conn, add_source(conn), 5)
        conn.execute(
            sa.update(t).where(t.c.id == ids[0]).values(locked_until=now() + timedelta(minutes=5))
        )
        conn.execute(
            sa.update(t).where(t.c.id.in_(ids[1:3])).values(locked_until=now() - timedelta(minutes=5))
        )
    result = run("status", "--json", env={"DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    tables = {t["table"]: t for t in json.loads(result.stdout)["tables"]}
    assert tables["listings_raw"] == {
        "table": "listings_raw", "rows": 5, "in_flight": 1, "expired_leases": 2
    }
    assert tables["sources"]["rows"] == 1
    text = run("status", env={"DATABASE_URL": db_url})
    assert text.returncode == 0
    assert text.stdout.splitlines()[0].split() == ["table", "rows", "in", "flight", "expired", "leases"]


def test_a_malformed_database_url_is_one_clear_line():
    assert_one_line_error(run("status", env={"DATABASE_URL": "not a url"}), "DATABASE_URL", "not a url")


def test_an_unreachable_database_is_one_clear_line():
    result = run("status", env={"DATABASE_URL": "postgresql://nobody@127.0.0.1:9/nowhere"})
    assert_one_line_error(result, "cannot connect to postgresql+psycopg://nobody@127.0.0.1:9/nowhere")


def test_the_password_never_appears_in_errors():
    result = run("status", env={"DATABASE_URL": "postgresql://u:s3cret-pw@127.0.0.1:9/x"})
    assert_one_line_error(result, "***")
    assert "s3cret-pw" not in result.stderr + result.stdout


def test_a_database_newer_than_the_code_stops_the_command(engine, db_url):
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'zz_future'"))
    assert_one_line_error(run("status", env={"DATABASE_URL": db_url}), "zz_future", "newer than this code")
    assert_one_line_error(run("db", "upgrade", env={"DATABASE_URL": db_url}), "newer than this code")


def test_an_unmigrated_database_asks_for_db_upgrade(empty_db_url):
    result = run("status", env={"DATABASE_URL": empty_db_url})
    assert_one_line_error(result, "run `pipeline db upgrade`")
