-- Queue listings_raw.unprocessed on sqlite: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_listings_raw_unprocessed_free (rows never leased, in the queue's order) and ix_listings_raw_unprocessed_leased (expired leases, oldest first); the update by pk_listings_raw
UPDATE listings_raw SET attempts=(listings_raw.attempts + 1), locked_until=?, claimed_by=?, claim_token=? WHERE listings_raw.id IN (SELECT anon_1.id
FROM (SELECT listings_raw.id AS id
FROM listings_raw
WHERE listings_raw.processed_at IS NULL AND listings_raw.locked_until IS NOT NULL AND listings_raw.locked_until <= ? ORDER BY listings_raw.locked_until
 LIMIT ? OFFSET ?) AS anon_1 UNION ALL SELECT anon_2.id
FROM (SELECT listings_raw.id AS id
FROM listings_raw
WHERE listings_raw.processed_at IS NULL AND listings_raw.locked_until IS NULL ORDER BY listings_raw.fetched_at ASC, listings_raw.id ASC
 LIMIT ? OFFSET ?) AS anon_2
 LIMIT ? OFFSET ?) RETURNING id, source_id, source_item_id, url, raw_json, content_hash, fetched_at, processed_at, attempts, last_error, locked_until, claimed_by, claim_token;

-- complete (sets processed_at, last_error)
-- served by pk_listings_raw (the ids held), fenced by claim_token and claimed_by
UPDATE listings_raw SET processed_at=?, last_error=?, locked_until=?, claimed_by=?, claim_token=? WHERE listings_raw.id IN (__[POSTCOMPILE_ids]) AND listings_raw.claim_token = ? AND listings_raw.claimed_by = ? RETURNING id;

-- extend
-- served by pk_listings_raw (the ids held), fenced by claim_token and claimed_by
UPDATE listings_raw SET locked_until=? WHERE listings_raw.id IN (__[POSTCOMPILE_ids]) AND listings_raw.claim_token = ? AND listings_raw.claimed_by = ? AND listings_raw.locked_until > ? RETURNING id;
