-- Queue sources.due on mariadb: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim_expired
-- served by ix_sources_due_free (MariaDB: the pending columns and the lease lead it), a range; locking the rows taken, skipping those other claims hold
SELECT sources.id, sources.name, sources.url, sources.source_type, sources.config, sources.enabled, sources.fetch_interval_minutes, sources.next_fetch_at, sources.last_fetched_at, sources.last_success_at, sources.consecutive_failures, sources.last_failure_reason, sources.disabled_reason, sources.priority, sources.adaptive_cadence, sources.min_interval_minutes, sources.max_interval_minutes, sources.etag, sources.last_modified, sources.content_hash, sources.created_at, sources.site_url, sources.attempts, sources.politeness_group, sources.locked_until, sources.claimed_by, sources.claim_token, utc_timestamp(6) AS claim_clock
FROM sources
WHERE sources.enabled = 1 AND sources.locked_until IS NOT NULL AND sources.locked_until <= utc_timestamp(6) AND (sources.next_fetch_at IS NULL OR sources.next_fetch_at <= utc_timestamp(6)) ORDER BY sources.locked_until
 LIMIT %(claim_limit)s FOR UPDATE SKIP LOCKED;

-- claim_free
-- served by ix_sources_due_free (MariaDB: the pending columns and the lease lead it), a range; locking the rows taken, skipping those other claims hold
SELECT sources.id, sources.name, sources.url, sources.source_type, sources.config, sources.enabled, sources.fetch_interval_minutes, sources.next_fetch_at, sources.last_fetched_at, sources.last_success_at, sources.consecutive_failures, sources.last_failure_reason, sources.disabled_reason, sources.priority, sources.adaptive_cadence, sources.min_interval_minutes, sources.max_interval_minutes, sources.etag, sources.last_modified, sources.content_hash, sources.created_at, sources.site_url, sources.attempts, sources.politeness_group, sources.locked_until, sources.claimed_by, sources.claim_token, utc_timestamp(6) AS claim_clock
FROM sources
WHERE sources.enabled = 1 AND sources.locked_until IS NULL AND (sources.next_fetch_at IS NULL OR sources.next_fetch_at <= utc_timestamp(6)) ORDER BY sources.priority + coalesce(floor(timestampdiff(SECOND, sources.next_fetch_at, utc_timestamp(6)) / 600.0), 0) DESC, sources.next_fetch_at ASC, sources.id ASC
 LIMIT %(claim_limit)s FOR UPDATE SKIP LOCKED;

-- claim
-- served by pk_sources (the ids the locking reads took, in the same transaction)
UPDATE sources SET attempts=(sources.attempts + 1), locked_until=%(claim_until)s, claimed_by=%(claim_worker)s, claim_token=%(claim_token)s WHERE sources.id IN (__[POSTCOMPILE_claim_ids]);

-- complete (sets next_fetch_at, attempts, last_fetched_at, consecutive_failures, last_failure_reason, last_success_at, etag, last_modified)
-- served by pk_sources (the ids held), fenced by claim_token and claimed_by
UPDATE sources SET next_fetch_at=%(set_next_fetch_at)s, last_fetched_at=%(set_last_fetched_at)s, last_success_at=%(set_last_success_at)s, consecutive_failures=%(set_consecutive_failures)s, last_failure_reason=%(set_last_failure_reason)s, etag=%(set_etag)s, last_modified=%(set_last_modified)s, attempts=%(set_attempts)s, locked_until=%(locked_until)s, claimed_by=%(claimed_by)s, claim_token=%(claim_token)s WHERE sources.id IN (__[POSTCOMPILE_ids]) AND sources.claim_token = %(fence_token)s AND sources.claimed_by = %(fence_worker)s;

-- extend
-- served by pk_sources (the ids held), fenced by claim_token and claimed_by
UPDATE sources SET locked_until=%(claim_until)s WHERE sources.id IN (__[POSTCOMPILE_ids]) AND sources.claim_token = %(fence_token)s AND sources.claimed_by = %(fence_worker)s AND sources.locked_until > %(claim_now)s;
