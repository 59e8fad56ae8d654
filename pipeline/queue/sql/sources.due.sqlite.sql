-- Queue sources.due on sqlite: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_sources_due_free (rows never leased, in the queue's order) and ix_sources_due_leased (expired leases, oldest first); the update by pk_sources
UPDATE sources SET attempts=(sources.attempts + 1), locked_until=?, claimed_by=?, claim_token=? WHERE sources.id IN (SELECT anon_1.id
FROM (SELECT sources.id AS id
FROM sources
WHERE sources.enabled = 1 AND sources.locked_until IS NOT NULL AND sources.locked_until <= ? AND (sources.next_fetch_at IS NULL OR sources.next_fetch_at <= ?) ORDER BY sources.locked_until
 LIMIT ? OFFSET ?) AS anon_1 UNION ALL SELECT anon_2.id
FROM (SELECT sources.id AS id
FROM sources
WHERE sources.enabled = 1 AND sources.locked_until IS NULL AND (sources.next_fetch_at IS NULL OR sources.next_fetch_at <= ?) ORDER BY sources.priority + coalesce(CAST(((julianday(?) - julianday(sources.next_fetch_at)) * 86400.0) / (600.0 + 0.0) AS INTEGER), 0) DESC, sources.next_fetch_at ASC NULLS FIRST, sources.id ASC
 LIMIT ? OFFSET ?) AS anon_2
 LIMIT ? OFFSET ?) RETURNING id, name, url, source_type, config, enabled, fetch_interval_minutes, next_fetch_at, last_fetched_at, last_success_at, consecutive_failures, last_failure_reason, disabled_reason, priority, adaptive_cadence, min_interval_minutes, max_interval_minutes, etag, last_modified, content_hash, created_at, site_url, attempts, politeness_group, locked_until, claimed_by, claim_token;

-- complete (sets next_fetch_at, attempts, last_fetched_at, consecutive_failures, last_failure_reason, last_success_at, etag, last_modified)
-- served by pk_sources (the ids held), fenced by claim_token and claimed_by
UPDATE sources SET next_fetch_at=?, last_fetched_at=?, last_success_at=?, consecutive_failures=?, last_failure_reason=?, etag=?, last_modified=?, attempts=?, locked_until=?, claimed_by=?, claim_token=? WHERE sources.id IN (__[POSTCOMPILE_ids]) AND sources.claim_token = ? AND sources.claimed_by = ? RETURNING id;

-- extend
-- served by pk_sources (the ids held), fenced by claim_token and claimed_by
UPDATE sources SET locked_until=? WHERE sources.id IN (__[POSTCOMPILE_ids]) AND sources.claim_token = ? AND sources.claimed_by = ? AND sources.locked_until > ? RETURNING id;
