-- Queue sources.due (polite: per-host limits) on postgresql: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_sources_due_levels (the priorities in use, then each level's rows never leased, in its order) and ix_sources_due_leased (expired leases, oldest first); the update by pk_sources; each group's fetches in flight counted over ix_sources_politeness_leased
WITH RECURSIVE closed_groups AS MATERIALIZED
(SELECT coalesce(jsonb_object_agg(closed_groups_each.name, true), CAST(%(param_5)s::VARCHAR AS JSONB)) AS names
FROM (SELECT closed.name AS name
FROM (SELECT g.name AS name
FROM politeness_groups AS g
WHERE g.next_request_at > now() UNION ALL SELECT in_flight.name AS name
FROM (SELECT leased.politeness_group AS name, count(*) AS n
FROM sources AS leased
WHERE leased.claimed_by IS NOT NULL AND leased.locked_until > now() GROUP BY leased.politeness_group) AS in_flight JOIN politeness_groups AS g ON g.name = in_flight.name JOIN politeness_groups AS d ON d.name = %(name_1)s::VARCHAR
WHERE in_flight.n >= coalesce(g.max_in_flight, d.max_in_flight)) AS closed) AS closed_groups_each),
expired AS MATERIALIZED
(SELECT sources.id AS id
FROM sources
WHERE sources.enabled AND sources.locked_until IS NOT NULL AND sources.locked_until <= now() AND (sources.next_fetch_at IS NULL OR sources.next_fetch_at <= now()) AND NOT ((SELECT closed_groups.names
FROM closed_groups) ? sources.politeness_group) ORDER BY sources.locked_until
 LIMIT %(claim_scan)s::INTEGER FOR NO KEY UPDATE OF sources SKIP LOCKED),
levels(level) AS
(SELECT (SELECT sources.priority
FROM sources
WHERE sources.enabled AND sources.locked_until IS NULL ORDER BY sources.priority DESC
 LIMIT %(param_7)s::INTEGER) AS level UNION ALL SELECT (SELECT sources.priority
FROM sources
WHERE sources.enabled AND sources.locked_until IS NULL AND sources.priority < levels.level ORDER BY sources.priority DESC
 LIMIT %(param_8)s::INTEGER) AS anon_3
FROM levels
WHERE levels.level IS NOT NULL),
free AS MATERIALIZED
(SELECT levelled.id AS id
FROM (SELECT aged_rows.id AS id, aged_rows.priority AS priority, aged_rows.next_fetch_at AS next_fetch_at
FROM levels JOIN LATERAL (SELECT sources.id AS id, sources.priority AS priority, sources.next_fetch_at AS next_fetch_at
FROM sources
WHERE sources.enabled AND sources.locked_until IS NULL AND sources.priority = levels.level AND coalesce(sources.next_fetch_at, '-infinity') > '-infinity' AND coalesce(sources.next_fetch_at, '-infinity') <= now() AND (sources.next_fetch_at IS NULL OR sources.next_fetch_at <= now()) AND NOT ((SELECT closed_groups.names
FROM closed_groups) ? sources.politeness_group) ORDER BY sources.priority, coalesce(sources.next_fetch_at, '-infinity'), sources.id
 LIMIT %(claim_scan)s::INTEGER FOR NO KEY UPDATE OF sources SKIP LOCKED) AS aged_rows ON true UNION ALL SELECT undated_rows.id AS id, undated_rows.priority AS priority, undated_rows.next_fetch_at AS next_fetch_at
FROM levels JOIN LATERAL (SELECT sources.id AS id, sources.priority AS priority, sources.next_fetch_at AS next_fetch_at
FROM sources
WHERE sources.enabled AND sources.locked_until IS NULL AND sources.priority = levels.level AND coalesce(sources.next_fetch_at, '-infinity') = '-infinity' AND (sources.next_fetch_at IS NULL OR sources.next_fetch_at <= now()) AND NOT ((SELECT closed_groups.names
FROM closed_groups) ? sources.politeness_group) ORDER BY sources.priority, coalesce(sources.next_fetch_at, '-infinity'), sources.id
 LIMIT %(claim_scan)s::INTEGER FOR NO KEY UPDATE OF sources SKIP LOCKED) AS undated_rows ON true) AS levelled ORDER BY levelled.priority + coalesce(floor(EXTRACT(epoch FROM now() - levelled.next_fetch_at) / CAST(600.0 AS NUMERIC)), 0) DESC, levelled.next_fetch_at ASC NULLS FIRST, levelled.id ASC
 LIMIT %(claim_scan)s::INTEGER),
cand AS MATERIALIZED
(SELECT sources.id AS id, sources.politeness_group AS grp, sources.priority AS priority, sources.next_fetch_at AS next_fetch_at, branches.branch AS branch
FROM sources JOIN (SELECT expired.id AS id, %(param_4)s::INTEGER AS branch
FROM expired UNION ALL SELECT free.id AS id, %(param_6)s::INTEGER AS branch
FROM free) AS branches ON branches.id = sources.id),
locked AS MATERIALIZED
(SELECT politeness_groups.name AS name, politeness_groups.claims AS claims, coalesce(politeness_groups.max_in_flight, d.max_in_flight) AS max_in_flight, coalesce(politeness_groups.min_interval_ms, d.min_interval_ms) AS interval_ms
FROM politeness_groups JOIN politeness_groups AS d ON d.name = %(name_2)s::VARCHAR
WHERE politeness_groups.name IN (SELECT cand.grp
FROM cand) AND (politeness_groups.next_request_at IS NULL OR politeness_groups.next_request_at <= clock_timestamp()) FOR NO KEY UPDATE OF politeness_groups SKIP LOCKED),
room AS MATERIALIZED
(SELECT locked.name AS name, locked.interval_ms AS interval_ms, (locked.max_in_flight - (SELECT count(*) AS count_1
FROM sources AS leased
WHERE leased.politeness_group = locked.name AND leased.claimed_by IS NOT NULL AND leased.locked_until > now())) - (locked.claims - seen.claims) AS room
FROM locked JOIN politeness_groups AS seen ON seen.name = locked.name),
picked AS MATERIALIZED
(SELECT ranked.id AS id, ranked.grp AS grp, ranked.interval_ms AS interval_ms
FROM (SELECT cand.id AS id, cand.grp AS grp, cand.branch AS branch, cand.priority AS priority, cand.next_fetch_at AS next_fetch_at, room.interval_ms AS interval_ms, room.room AS room, row_number() OVER (PARTITION BY cand.grp ORDER BY cand.branch, cand.priority + coalesce(floor(EXTRACT(epoch FROM now() - cand.next_fetch_at) / CAST(600.0 AS NUMERIC)), 0) DESC, cand.next_fetch_at ASC NULLS FIRST, cand.id ASC) AS rn
FROM cand JOIN room ON room.name = cand.grp) AS ranked
WHERE ranked.rn <= ranked.room AND (ranked.interval_ms = %(interval_ms_1)s::INTEGER OR ranked.rn = %(rn_1)s::INTEGER) ORDER BY ranked.branch, ranked.priority + coalesce(floor(EXTRACT(epoch FROM now() - ranked.next_fetch_at) / CAST(600.0 AS NUMERIC)), 0) DESC, ranked.next_fetch_at ASC NULLS FIRST, ranked.id ASC
 LIMIT %(claim_limit)s::INTEGER),
bump AS
(UPDATE politeness_groups SET next_request_at=(clock_timestamp() + make_interval(%(make_interval_1)s::INTEGER, %(make_interval_2)s::INTEGER, %(make_interval_3)s::INTEGER, %(make_interval_4)s::INTEGER, %(make_interval_5)s::INTEGER, %(make_interval_6)s::INTEGER, CAST(pg.interval_ms AS FLOAT) / CAST(%(param_2)s AS FLOAT))), deferred_reason=%(param_3)s::VARCHAR, claims=(politeness_groups.claims + pg.n) FROM (SELECT picked.grp AS grp, picked.interval_ms AS interval_ms, count(*) AS n
FROM picked GROUP BY picked.grp, picked.interval_ms) AS pg WHERE politeness_groups.name = pg.grp),
taken AS
(UPDATE sources SET attempts=(sources.attempts + 1), locked_until=(now() + %(claim_lease)s), claimed_by=%(claim_worker)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM picked WHERE sources.id = picked.id RETURNING sources.id, sources.name, sources.url, sources.source_type, sources.config, sources.enabled, sources.fetch_interval_minutes, sources.next_fetch_at, sources.last_fetched_at, sources.last_success_at, sources.consecutive_failures, sources.last_failure_reason, sources.disabled_reason, sources.priority, sources.adaptive_cadence, sources.min_interval_minutes, sources.max_interval_minutes, sources.etag, sources.last_modified, sources.content_hash, sources.created_at, sources.site_url, sources.attempts, sources.politeness_group, sources.locked_until, sources.claimed_by, sources.claim_token),
started AS
(INSERT INTO ingestion_events (event, source_id, source_type, run_id, scheduled_at) SELECT %(param_1)s::VARCHAR AS anon_1, taken.id AS id, taken.source_type AS source_type, %(started_run_id)s::VARCHAR AS anon_2, taken.next_fetch_at AS next_fetch_at
FROM taken),
counted AS
(INSERT INTO metric_counts (name, label, shard, value) SELECT %(param_9)s::VARCHAR AS anon_4, %(param_10)s::VARCHAR AS anon_5, CAST(floor(random() * %(random_1)s::INTEGER) AS SMALLINT) AS floor_1, CAST(count(*) AS FLOAT) AS count_2
FROM (SELECT taken.id AS id
FROM taken) AS anon_6
HAVING count(*) > %(count_3)s::INTEGER ON CONFLICT (name, label, shard) DO UPDATE SET value = (metric_counts.value + excluded.value))
 SELECT taken.id, taken.name, taken.url, taken.source_type, taken.config, taken.enabled, taken.fetch_interval_minutes, taken.next_fetch_at, taken.last_fetched_at, taken.last_success_at, taken.consecutive_failures, taken.last_failure_reason, taken.disabled_reason, taken.priority, taken.adaptive_cadence, taken.min_interval_minutes, taken.max_interval_minutes, taken.etag, taken.last_modified, taken.content_hash, taken.created_at, taken.site_url, taken.attempts, taken.politeness_group, taken.locked_until, taken.claimed_by, taken.claim_token
FROM taken;

-- complete (sets next_fetch_at, attempts, last_fetched_at, consecutive_failures, last_failure_reason, last_success_at, etag, last_modified)
-- served by pk_sources (the ids held), fenced by claim_token and claimed_by
UPDATE sources SET next_fetch_at=%(set_next_fetch_at)s::TIMESTAMP WITH TIME ZONE, last_fetched_at=%(set_last_fetched_at)s::TIMESTAMP WITH TIME ZONE, last_success_at=%(set_last_success_at)s::TIMESTAMP WITH TIME ZONE, consecutive_failures=%(set_consecutive_failures)s::INTEGER, last_failure_reason=%(set_last_failure_reason)s::VARCHAR, etag=%(set_etag)s::VARCHAR, last_modified=%(set_last_modified)s::VARCHAR, attempts=%(set_attempts)s::INTEGER, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR WHERE sources.id = ANY (%(ids)s::BIGINT[]) AND sources.claim_token = %(fence_token)s::VARCHAR AND sources.claimed_by = %(fence_worker)s::VARCHAR RETURNING sources.id;

-- complete_each (sets next_fetch_at, attempts, last_fetched_at, consecutive_failures, last_failure_reason, last_success_at, etag, last_modified)
-- served by pk_sources (the ids held), fenced by claim_token and claimed_by
UPDATE sources SET next_fetch_at=anon_1.next_fetch_at, last_fetched_at=anon_1.last_fetched_at, last_success_at=anon_1.last_success_at, consecutive_failures=anon_1.consecutive_failures, last_failure_reason=anon_1.last_failure_reason, etag=anon_1.etag, last_modified=anon_1.last_modified, attempts=anon_1.attempts, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM jsonb_to_recordset(CAST(%(rows)s::VARCHAR AS JSONB)) AS anon_1(id BIGINT, fence_token TEXT, fence_worker TEXT, next_fetch_at TIMESTAMP WITH TIME ZONE, attempts INTEGER, last_fetched_at TIMESTAMP WITH TIME ZONE, consecutive_failures INTEGER, last_failure_reason VARCHAR(32), last_success_at TIMESTAMP WITH TIME ZONE, etag TEXT, last_modified TEXT) WHERE sources.id = anon_1.id AND sources.claim_token = anon_1.fence_token AND sources.claimed_by = anon_1.fence_worker RETURNING sources.id;

-- extend
-- served by pk_sources (the ids held), fenced by claim_token and claimed_by
UPDATE sources SET locked_until=(now() + %(claim_lease)s) WHERE sources.id = ANY (%(ids)s::BIGINT[]) AND sources.claim_token = %(fence_token)s::VARCHAR AND sources.claimed_by = %(fence_worker)s::VARCHAR AND sources.locked_until > now() RETURNING sources.id;
