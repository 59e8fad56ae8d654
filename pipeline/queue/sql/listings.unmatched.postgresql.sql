-- Queue listings.unmatched on postgresql: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_listings_unmatched_free (rows never leased, in the queue's order) and ix_listings_unmatched_leased (expired leases, oldest first); the update by pk_listings
WITH expired AS MATERIALIZED
(SELECT listings.id AS id
FROM listings
WHERE listings.matched_at IS NULL AND listings.locked_until IS NOT NULL AND listings.locked_until <= now() ORDER BY listings.locked_until
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE SKIP LOCKED),
free AS MATERIALIZED
(SELECT listings.id AS id
FROM listings
WHERE listings.matched_at IS NULL AND listings.locked_until IS NULL ORDER BY listings.updated_at ASC, listings.id ASC
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE SKIP LOCKED),
c AS MATERIALIZED
(SELECT expired.id AS id
FROM expired UNION ALL SELECT free.id AS id
FROM free
 LIMIT %(claim_limit)s::INTEGER)
 UPDATE listings SET locked_until=(now() + %(claim_lease)s), claimed_by=%(claim_worker)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM c WHERE listings.id = c.id RETURNING listings.id, listings.source_id, listings.source_item_id, listings.url, listings.title, listings.summary, listings.author, listings.published_at, listings.categories, listings.content_hash, listings.ingested_at, listings.updated_at, listings.matched_at, listings.raw_id, listings.item_key, listings.locked_until, listings.claimed_by, listings.claim_token, listings.cluster_id, listings.simhash, listings.gone_at, listings.story_key, listings.story_band_0, listings.story_band_1, listings.story_band_2, listings.story_band_3, listings.price, listings.fields, listings.words, listings.missed;

-- complete (sets matched_at)
-- served by pk_listings (the ids held), fenced by claim_token and claimed_by
UPDATE listings SET matched_at=%(set_matched_at)s::TIMESTAMP WITH TIME ZONE, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR WHERE listings.id = ANY (%(ids)s::BIGINT[]) AND listings.claim_token = %(fence_token)s::VARCHAR AND listings.claimed_by = %(fence_worker)s::VARCHAR RETURNING listings.id;

-- complete_each (sets matched_at)
-- served by pk_listings (the ids held), fenced by claim_token and claimed_by
UPDATE listings SET matched_at=anon_1.matched_at, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM jsonb_to_recordset(CAST(%(rows)s::VARCHAR AS JSONB)) AS anon_1(id BIGINT, fence_token TEXT, fence_worker TEXT, matched_at TIMESTAMP WITH TIME ZONE) WHERE listings.id = anon_1.id AND listings.claim_token = anon_1.fence_token AND listings.claimed_by = anon_1.fence_worker RETURNING listings.id;

-- extend
-- served by pk_listings (the ids held), fenced by claim_token and claimed_by
UPDATE listings SET locked_until=(now() + %(claim_lease)s) WHERE listings.id = ANY (%(ids)s::BIGINT[]) AND listings.claim_token = %(fence_token)s::VARCHAR AND listings.claimed_by = %(fence_worker)s::VARCHAR AND listings.locked_until > now() RETURNING listings.id;
