-- The collector's item storage on postgresql (pipeline/fetching/collector.py store_items):
-- the statement pipeline/backends/postgresql.py store_changed sends, rendered by
-- tests/test_golden_sql.py (which fails when it changes). The batch's items are one
-- JSON array of arrays, %(rows)s.
-- served by pk_source_items (source_id, source_item_id), the ON CONFLICT target;
-- listings_raw takes plain inserts.
WITH incoming AS MATERIALIZED (
    SELECT (e->>0)::bigint AS source_id, e->>1 AS source_item_id, e->>2 AS content_hash, e->>3 AS url, e->4 AS raw_json
    FROM jsonb_array_elements(%(rows)s::jsonb) AS e
), changed AS (
    INSERT INTO source_items (source_id, source_item_id, content_hash)
    SELECT source_id, source_item_id, content_hash FROM incoming
    ON CONFLICT (source_id, source_item_id) DO UPDATE
        SET content_hash = excluded.content_hash, changed_at = CURRENT_TIMESTAMP
        WHERE source_items.content_hash <> excluded.content_hash
    RETURNING source_id, source_item_id
)
INSERT INTO listings_raw (source_id, source_item_id, content_hash, url, raw_json)
SELECT i.source_id, i.source_item_id, i.content_hash, i.url, i.raw_json
FROM incoming i JOIN changed c USING (source_id, source_item_id)
RETURNING source_id;
