-- Queue sources.due on postgresql: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_sources_due_levels (the priorities in use, then each level's rows never leased, in its order) and ix_sources_due_leased (expired leases, oldest first); the update by pk_sources
WITH RECURSIVE expired AS MATERIALIZED
(SELECT sources.id AS id
FROM sources
WHERE sources.enabled AND sources.locked_until IS NOT NULL AND sources.locked_until <= now() AND (sources.next_fetch_at IS NULL OR sources.next_fetch_at <= now()) ORDER BY sources.locked_until
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE SKIP LOCKED),
levels(level) AS
(SELECT (SELECT sources.priority
FROM sources
WHERE sources.enabled AND sources.locked_until IS NULL ORDER BY sources.priority DESC
 LIMIT %(param_1)s::INTEGER) AS level UNION ALL SELECT (SELECT sources.priority
FROM sources
WHERE sources.enabled AND sources.locked_until IS NULL AND sources.priority < levels.level ORDER BY sources.priority DESC
 LIMIT %(param_2)s::INTEGER) AS anon_1
FROM levels
WHERE levels.level IS NOT NULL),
free AS MATERIALIZED
(SELECT levelled.id AS id
FROM (SELECT aged_rows.id AS id, aged_rows.priority AS priority, aged_rows.next_fetch_at AS next_fetch_at
FROM levels JOIN LATERAL (SELECT sources.id AS id, sources.priority AS priority, sources.next_fetch_at AS next_fetch_at
FROM sources
WHERE sources.enabled AND sources.locked_until IS NULL AND sources.priority = levels.level AND coalesce(sources.next_fetch_at, '-infinity') > '-infinity' AND coalesce(sources.next_fetch_at, '-infinity') <= now() AND (sources.next_fetch_at IS NULL OR sources.next_fetch_at <= now()) ORDER BY sources.priority, coalesce(sources.next_fetch_at, '-infinity'), sources.id
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE OF sources SKIP LOCKED) AS aged_rows ON true UNION ALL SELECT undated_rows.id AS id, undated_rows.priority AS priority, undated_rows.next_fetch_at AS next_fetch_at
FROM levels JOIN LATERAL (SELECT sources.id AS id, sources.priority AS priority, sources.next_fetch_at AS next_fetch_at
FROM sources
WHERE sources.enabled AND sources.locked_until IS NULL AND sources.priority = levels.level AND coalesce(sources.next_fetch_at, '-infinity') = '-infinity' AND (sources.next_fetch_at IS NULL OR sources.next_fetch_at <= now()) ORDER BY sources.priority, coalesce(sources.next_fetch_at, '-infinity'), sources.id
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE OF sources SKIP LOCKED) AS undated_rows ON true) AS levelled ORDER BY levelled.priority + coalesce(floor(EXTRACT(epoch FROM now() - levelled.next_fetch_at) / CAST(600.0 AS NUMERIC)), 0) DESC, levelled.next_fetch_at ASC NULLS FIRST, levelled.id ASC
 LIMIT %(claim_limit)s::INTEGER),
c AS MATERIALIZED
(SELECT expired.id AS id
FROM expired UNION ALL SELECT free.id AS id
FROM free
 LIMIT %(claim_limit)s::INTEGER)
 UPDATE sources SET attempts=(sources.attempts + 1), locked_until=(now() + %(claim_lease)s), claimed_by=%(claim_worker)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM c WHERE sources.id = c.id RETURNING sources.id, sources.name, sources.url, sources.source_type, sources.config, sources.enabled, sources.fetch_interval_minutes, sources.next_fetch_at, sources.last_fetched_at, sources.last_success_at, sources.consecutive_failures, sources.last_failure_reason, sources.disabled_reason, sources.priority, sources.adaptive_cadence, sources.min_interval_minutes, sources.max_interval_minutes, sources.etag, sources.last_modified, sources.content_hash, sources.created_at, sources.site_url, sources.attempts, sources.politeness_group, sources.locked_until, sources.claimed_by, sources.claim_token;

-- complete (sets next_fetch_at, attempts, last_fetched_at, consecutive_failures, last_failure_reason, last_success_at, etag, last_modified)
-- served by pk_sources (the ids held), fenced by claim_token and claimed_by
UPDATE sources SET next_fetch_at=%(set_next_fetch_at)s::TIMESTAMP WITH TIME ZONE, last_fetched_at=%(set_last_fetched_at)s::TIMESTAMP WITH TIME ZONE, last_success_at=%(set_last_success_at)s::TIMESTAMP WITH TIME ZONE, consecutive_failures=%(set_consecutive_failures)s::INTEGER, last_failure_reason=%(set_last_failure_reason)s::VARCHAR, etag=%(set_etag)s::VARCHAR, last_modified=%(set_last_modified)s::VARCHAR, attempts=%(set_attempts)s::INTEGER, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR WHERE sources.id = ANY (%(ids)s::BIGINT[]) AND sources.claim_token = %(fence_token)s::VARCHAR AND sources.claimed_by = %(fence_worker)s::VARCHAR RETURNING sources.id;

-- complete_each (sets next_fetch_at, attempts, last_fetched_at, consecutive_failures, last_failure_reason, last_success_at, etag, last_modified)
-- served by pk_sources (the ids held), fenced by claim_token and claimed_by
UPDATE sources SET next_fetch_at=anon_1.next_fetch_at, last_fetched_at=anon_1.last_fetched_at, last_success_at=anon_1.last_success_at, consecutive_failures=anon_1.consecutive_failures, last_failure_reason=anon_1.last_failure_reason, etag=anon_1.etag, last_modified=anon_1.last_modified, attempts=anon_1.attempts, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM jsonb_to_recordset(CAST(%(rows)s::VARCHAR AS JSONB)) AS anon_1(id BIGINT, fence_token TEXT, fence_worker TEXT, next_fetch_at TIMESTAMP WITH TIME ZONE, attempts INTEGER, last_fetched_at TIMESTAMP WITH TIME ZONE, consecutive_failures INTEGER, last_failure_reason VARCHAR(32), last_success_at TIMESTAMP WITH TIME ZONE, etag TEXT, last_modified TEXT) WHERE sources.id = anon_1.id AND sources.claim_token = anon_1.fence_token AND sources.claimed_by = anon_1.fence_worker RETURNING sources.id;

-- extend
-- served by pk_sources (the ids held), fenced by claim_token and claimed_by
UPDATE sources SET locked_until=(now() + %(claim_lease)s) WHERE sources.id = ANY (%(ids)s::BIGINT[]) AND sources.claim_token = %(fence_token)s::VARCHAR AND sources.claimed_by = %(fence_worker)s::VARCHAR AND sources.locked_until > now() RETURNING sources.id;
