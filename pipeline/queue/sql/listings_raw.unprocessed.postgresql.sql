-- Queue listings_raw.unprocessed on postgresql: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_listings_raw_unprocessed_free (rows never leased, in the queue's order) and ix_listings_raw_unprocessed_leased (expired leases, oldest first); the update by pk_listings_raw
WITH expired AS MATERIALIZED
(SELECT listings_raw.id AS id
FROM listings_raw
WHERE listings_raw.processed_at IS NULL AND listings_raw.locked_until IS NOT NULL AND listings_raw.locked_until <= now() ORDER BY listings_raw.locked_until
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE SKIP LOCKED),
free AS MATERIALIZED
(SELECT listings_raw.id AS id
FROM listings_raw
WHERE listings_raw.processed_at IS NULL AND listings_raw.locked_until IS NULL ORDER BY listings_raw.fetched_at ASC, listings_raw.id ASC
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE SKIP LOCKED),
c AS MATERIALIZED
(SELECT expired.id AS id
FROM expired UNION ALL SELECT free.id AS id
FROM free
 LIMIT %(claim_limit)s::INTEGER)
 UPDATE listings_raw SET attempts=(listings_raw.attempts + 1), locked_until=(now() + %(claim_lease)s), claimed_by=%(claim_worker)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM c WHERE listings_raw.id = c.id RETURNING listings_raw.id, listings_raw.source_id, listings_raw.source_item_id, listings_raw.url, listings_raw.raw_json, listings_raw.content_hash, listings_raw.fetched_at, listings_raw.processed_at, listings_raw.attempts, listings_raw.last_error, listings_raw.locked_until, listings_raw.claimed_by, listings_raw.claim_token;

-- complete (sets processed_at, last_error)
-- served by pk_listings_raw (the ids held), fenced by claim_token and claimed_by
UPDATE listings_raw SET processed_at=%(set_processed_at)s::TIMESTAMP WITH TIME ZONE, last_error=%(set_last_error)s::VARCHAR, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR WHERE listings_raw.id = ANY (%(ids)s::BIGINT[]) AND listings_raw.claim_token = %(fence_token)s::VARCHAR AND listings_raw.claimed_by = %(fence_worker)s::VARCHAR RETURNING listings_raw.id;

-- complete_each (sets processed_at, last_error)
-- served by pk_listings_raw (the ids held), fenced by claim_token and claimed_by
UPDATE listings_raw SET processed_at=anon_1.processed_at, last_error=anon_1.last_error, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM jsonb_to_recordset(CAST(%(rows)s::VARCHAR AS JSONB)) AS anon_1(id BIGINT, fence_token TEXT, fence_worker TEXT, processed_at TIMESTAMP WITH TIME ZONE, last_error TEXT) WHERE listings_raw.id = anon_1.id AND listings_raw.claim_token = anon_1.fence_token AND listings_raw.claimed_by = anon_1.fence_worker RETURNING listings_raw.id;

-- extend
-- served by pk_listings_raw (the ids held), fenced by claim_token and claimed_by
UPDATE listings_raw SET locked_until=(now() + %(claim_lease)s) WHERE listings_raw.id = ANY (%(ids)s::BIGINT[]) AND listings_raw.claim_token = %(fence_token)s::VARCHAR AND listings_raw.claimed_by = %(fence_worker)s::VARCHAR AND listings_raw.locked_until > now() RETURNING listings_raw.id;
