-- name: append_owner_event
WITH event AS (
    SELECT %(owner)s::text AS owner_id, %(session_id)s::uuid AS id,
           clock_timestamp() AS created_at
),
owner_cursor AS (
    INSERT INTO owner_cursors AS c (owner_id, last_id)
    SELECT owner_id, count(*) FROM event GROUP BY owner_id ORDER BY owner_id
    ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
    RETURNING owner_id, last_id, pg_notify('ferryman', 'o:' || c.owner_id) IS NOT NULL AS notified
), owner_appended AS (
    INSERT INTO owner_events (owner_id, id, session_id, type, data)
    SELECT s.owner_id,
           c.last_id - count(*) OVER owner
               + row_number() OVER (owner ORDER BY s.created_at, s.id),
           s.id, %(type)s, %(data)s
    FROM event s JOIN owner_cursor c ON c.owner_id = s.owner_id
    WINDOW owner AS (PARTITION BY s.owner_id)
    RETURNING id
)
SELECT id FROM owner_appended;

-- name: append_session_event
WITH bumped AS (
    UPDATE sessions SET last_seq = last_seq + 1, updated_at = clock_timestamp()
    WHERE id = %(session_id)s
    RETURNING last_seq, attempt, owner_id
), appended AS (
    INSERT INTO session_events (session_id, seq, attempt, type, data)
    SELECT %(session_id)s, last_seq, attempt, %(type)s, %(data)s FROM bumped
    RETURNING session_id, seq, attempt, type, data, created_at,
        (SELECT owner_id FROM bumped) AS owner_id
)
SELECT * FROM appended WHERE pg_notify('ferryman', %(notify_key)s) IS NOT NULL;

-- name: assistant_versions
SELECT
a.id, a.owner_id, v.version, a.created_at, v.created_at AS updated_at, v.name,
v.description, v.model, v.instructions, v.model_settings, v.tools, v.approval_required,
v.metadata, v.compaction, v.delegates, v.script

FROM assistants a
JOIN assistant_versions v ON v.assistant_id = a.id
WHERE a.id = %(id)s AND (%(before)s::integer IS NULL OR v.version < %(before)s)
ORDER BY v.version DESC
LIMIT %(limit)s;

-- name: child_of_call
SELECT
   id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
   error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
   delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
   approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
   assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
   schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
   created_by_key_id, priority
FROM sessions
   WHERE parent_session_id = %s AND parent_tool_call_id = %s;

-- name: chunks_after
SELECT after_seq, chunk, text, created_at FROM session_deltas
WHERE session_id = %(session_id)s AND after_seq = %(after_seq)s AND chunk > %(chunk)s
    AND chunk < %(before)s
ORDER BY chunk;

-- name: claim
WITH candidate AS (
    SELECT s.id FROM sessions s
    WHERE EXISTS (SELECT 1 FROM workers me
                  WHERE me.id = %(worker)s AND me.stopped_at IS NULL)
      AND s.id <> ALL(%(busy)s::uuid[])
      AND (s.tools IS NULL OR s.tools <@ %(tools)s::jsonb)
      AND ((s.status = 'queued' AND s.deleted_at IS NULL)
       OR (s.status = 'running' AND (
            s.lease_worker_id IS NULL
            OR s.lease_expires_at < clock_timestamp()
            OR EXISTS (SELECT 1 FROM workers w
                       WHERE w.id = s.lease_worker_id AND w.stopped_at IS NOT NULL))))
    ORDER BY s.priority DESC, s.claim_key
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
), claimed AS (
    UPDATE sessions s SET
        status = 'running', attempt = s.attempt + 1,
        resumes = s.resumes + (s.status = 'running')::integer,
        last_seq = s.last_seq + (s.attempt = 0)::integer,
        lease_worker_id = %(worker)s, lease_pid = %(pid)s,
        lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s),
        updated_at = clock_timestamp()
    FROM candidate c WHERE s.id = c.id
    RETURNING s.id, s.owner_id, s.title, s.status, s.attempt, s.model, s.prompt, s.script, s.tools, s.metadata, s.active_stage, s.error, s.cancel_requested_at, s.lease_worker_id, s.lease_pid, s.lease_expires_at, s.last_seq, s.delivered_seq, s.created_at, s.updated_at, s.deleted_at, s.instructions, s.model_settings, s.approval_required, s.input_tokens, s.output_tokens, s.cached_tokens, s.resumes, s.assistant_id, s.assistant_version, s.client_tools, s.compaction, s.forked_from_session_id, s.forked_from_seq, s.schedule_id, s.schedule_fired_at, s.delegates, s.parent_session_id, s.parent_tool_call_id, s.depth, s.created_by_key_id, s.priority, s.claim_key
), started AS (
    INSERT INTO session_events (session_id, seq, attempt, type, data)
    SELECT s.id, s.last_seq, s.attempt, 'session_start',
           jsonb_build_object('workerId', %(worker)s::text, 'pid', %(pid)s::integer,
                              'attempt', s.attempt)
    FROM claimed s WHERE s.attempt = 1
    RETURNING session_id, seq, type, data,
        pg_notify('ferryman', 's:' || session_id) IS NOT NULL AS notified
),
owner_cursor AS (
    INSERT INTO owner_cursors AS c (owner_id, last_id)
    SELECT owner_id, count(*) FROM claimed GROUP BY owner_id ORDER BY owner_id
    ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
    RETURNING owner_id, last_id, pg_notify('ferryman', 'o:' || c.owner_id) IS NOT NULL AS notified
), owner_appended AS (
    INSERT INTO owner_events (owner_id, id, session_id, type, data)
    SELECT s.owner_id,
           c.last_id - count(*) OVER owner
               + row_number() OVER (owner ORDER BY s.created_at, s.id),
           s.id, 'session_status', jsonb_build_object('status', 'running', 'attempt', s.attempt, 'resumes', s.resumes)
    FROM claimed s JOIN owner_cursor c ON c.owner_id = s.owner_id
    WINDOW owner AS (PARTITION BY s.owner_id)
    RETURNING id
)
SELECT s.*, s.attempt - coalesce((
    SELECT e.attempt FROM session_events e
    WHERE e.session_id = s.id AND e.type = 'session_end'
    ORDER BY e.seq DESC LIMIT 1), 0) AS claims,
  CASE WHEN st.seq IS NULL THEN h.events
       WHEN coalesce(h.last, 0) = st.seq - 1 THEN coalesce(h.events, '[]'::jsonb)
           || jsonb_build_array(jsonb_build_object('seq', st.seq, 'type', st.type,
                                                   'data', st.data))
  END AS head
FROM claimed s
LEFT JOIN started st ON st.session_id = s.id
CROSS JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object('seq', e.seq, 'type', e.type, 'data', e.data)
                     ORDER BY e.seq) AS events,
           max(e.seq) AS last
    FROM (SELECT seq, type, data, sum(size) OVER (ORDER BY seq) AS upto
          FROM session_events WHERE session_id = s.id ORDER BY seq LIMIT %(head_events)s) e
    WHERE e.upto <= %(head_bytes)s) h
ORDER BY s.priority DESC, s.claim_key;

-- name: claim_lock
SELECT pg_advisory_xact_lock(7465726430);

-- name: claim_owner_limited
WITH running AS (
    SELECT r.owner_id, count(*) AS running FROM sessions r
    WHERE r.status = 'running' GROUP BY r.owner_id
), candidate AS (
    SELECT s.id, s.owner_id, s.status, s.priority, s.claim_key FROM sessions s
    WHERE EXISTS (SELECT 1 FROM workers me
                  WHERE me.id = %(worker)s AND me.stopped_at IS NULL)
      AND s.id <> ALL(%(busy)s::uuid[])
      AND (s.tools IS NULL OR s.tools <@ %(tools)s::jsonb)
      AND (s.status <> 'queued' OR s.owner_id NOT IN (
            SELECT owner_id FROM running WHERE running >= %(max_running)s))
      AND ((s.status = 'queued' AND s.deleted_at IS NULL)
       OR (s.status = 'running' AND (
            s.lease_worker_id IS NULL
            OR s.lease_expires_at < clock_timestamp()
            OR EXISTS (SELECT 1 FROM workers w
                       WHERE w.id = s.lease_worker_id AND w.stopped_at IS NOT NULL))))
    ORDER BY s.priority DESC, s.claim_key
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
), picked AS (
    SELECT c.id FROM (
        SELECT c.id, c.status, coalesce(r.running, 0) + count(*)
                   FILTER (WHERE c.status = 'queued')
                   OVER (PARTITION BY c.owner_id ORDER BY c.priority DESC, c.claim_key
                         ROWS UNBOUNDED PRECEDING) AS place
        FROM candidate c LEFT JOIN running r ON r.owner_id = c.owner_id) c
    WHERE c.status <> 'queued' OR c.place <= %(max_running)s
), claimed AS (
    UPDATE sessions s SET
        status = 'running', attempt = s.attempt + 1,
        resumes = s.resumes + (s.status = 'running')::integer,
        last_seq = s.last_seq + (s.attempt = 0)::integer,
        lease_worker_id = %(worker)s, lease_pid = %(pid)s,
        lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s),
        updated_at = clock_timestamp()
    FROM picked c WHERE s.id = c.id
    RETURNING s.id, s.owner_id, s.title, s.status, s.attempt, s.model, s.prompt, s.script, s.tools, s.metadata, s.active_stage, s.error, s.cancel_requested_at, s.lease_worker_id, s.lease_pid, s.lease_expires_at, s.last_seq, s.delivered_seq, s.created_at, s.updated_at, s.deleted_at, s.instructions, s.model_settings, s.approval_required, s.input_tokens, s.output_tokens, s.cached_tokens, s.resumes, s.assistant_id, s.assistant_version, s.client_tools, s.compaction, s.forked_from_session_id, s.forked_from_seq, s.schedule_id, s.schedule_fired_at, s.delegates, s.parent_session_id, s.parent_tool_call_id, s.depth, s.created_by_key_id, s.priority, s.claim_key
), started AS (
    INSERT INTO session_events (session_id, seq, attempt, type, data)
    SELECT s.id, s.last_seq, s.attempt, 'session_start',
           jsonb_build_object('workerId', %(worker)s::text, 'pid', %(pid)s::integer,
                              'attempt', s.attempt)
    FROM claimed s WHERE s.attempt = 1
    RETURNING session_id, seq, type, data,
        pg_notify('ferryman', 's:' || session_id) IS NOT NULL AS notified
),
owner_cursor AS (
    INSERT INTO owner_cursors AS c (owner_id, last_id)
    SELECT owner_id, count(*) FROM claimed GROUP BY owner_id ORDER BY owner_id
    ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
    RETURNING owner_id, last_id, pg_notify('ferryman', 'o:' || c.owner_id) IS NOT NULL AS notified
), owner_appended AS (
    INSERT INTO owner_events (owner_id, id, session_id, type, data)
    SELECT s.owner_id,
           c.last_id - count(*) OVER owner
               + row_number() OVER (owner ORDER BY s.created_at, s.id),
           s.id, 'session_status', jsonb_build_object('status', 'running', 'attempt', s.attempt, 'resumes', s.resumes)
    FROM claimed s JOIN owner_cursor c ON c.owner_id = s.owner_id
    WINDOW owner AS (PARTITION BY s.owner_id)
    RETURNING id
)
SELECT s.*, s.attempt - coalesce((
    SELECT e.attempt FROM session_events e
    WHERE e.session_id = s.id AND e.type = 'session_end'
    ORDER BY e.seq DESC LIMIT 1), 0) AS claims,
  CASE WHEN st.seq IS NULL THEN h.events
       WHEN coalesce(h.last, 0) = st.seq - 1 THEN coalesce(h.events, '[]'::jsonb)
           || jsonb_build_array(jsonb_build_object('seq', st.seq, 'type', st.type,
                                                   'data', st.data))
  END AS head
FROM claimed s
LEFT JOIN started st ON st.session_id = s.id
CROSS JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object('seq', e.seq, 'type', e.type, 'data', e.data)
                     ORDER BY e.seq) AS events,
           max(e.seq) AS last
    FROM (SELECT seq, type, data, sum(size) OVER (ORDER BY seq) AS upto
          FROM session_events WHERE session_id = s.id ORDER BY seq LIMIT %(head_events)s) e
    WHERE e.upto <= %(head_bytes)s) h
ORDER BY s.priority DESC, s.claim_key;

-- name: claim_webhook_deliveries
WITH due AS (
    SELECT id FROM webhook_deliveries
    WHERE delivered_at IS NULL AND abandoned_at IS NULL
      AND next_attempt_at <= clock_timestamp()
    ORDER BY next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE webhook_deliveries d
SET attempts = d.attempts + 1, last_attempt_at = clock_timestamp(),
    next_attempt_at = clock_timestamp() + make_interval(secs => %(hold)s)
FROM due, webhooks w
WHERE d.id = due.id AND w.id = d.webhook_id
RETURNING d.id, d.webhook_id, d.session_id, d.type, d.event, d.created_at, d.attempts,
          w.url, w.secret, w.run_start_seq;

-- name: client_call_events
SELECT seq, type, data FROM session_events
WHERE session_id = %s AND data->>'toolCallId' = %s
  AND type IN ('client_tool_call', 'client_tool_result',
               'tool_result')
ORDER BY seq;

-- name: count_rate
INSERT INTO rate_windows AS r (subject, action, window_start, count)
VALUES (%(subject)s, %(action)s, date_trunc('minute', clock_timestamp()), 1)
ON CONFLICT (subject, action) DO UPDATE SET
    count = CASE WHEN r.window_start = EXCLUDED.window_start THEN r.count + 1 ELSE 1 END,
    window_start = EXCLUDED.window_start
RETURNING count,
    ceil(extract(epoch FROM window_start + interval '1 minute' - clock_timestamp()))::integer
        AS retry_after;

-- name: count_threads
SELECT count(*) AS n FROM sessions
WHERE owner_id = %(owner)s AND deleted_at IS NULL
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb);

-- name: count_undelivered
SELECT count(*) AS n FROM sessions, LATERAL (
    SELECT FROM session_events e WHERE e.session_id = sessions.id
      AND e.type IN ('user_message', 'tool_approval_decided', 'client_tool_result',
                     'delegate_result')
      AND e.seq > greatest(sessions.delivered_seq, %(delivered)s)) e
WHERE sessions.id = %(session_id)s;

-- name: create_idle_session
WITH s AS (
    INSERT INTO sessions (id, owner_id, title, status, model, prompt, metadata, model_settings,
                          created_by_key_id, priority)
    VALUES (%(id)s, %(owner)s, %(title)s, 'idle', %(model)s, '', %(metadata)s, '{}',
            %(key)s, %(priority)s)
    ON CONFLICT (id) DO NOTHING
    RETURNING
id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
created_by_key_id, priority

),
owner_cursor AS (
    INSERT INTO owner_cursors AS c (owner_id, last_id)
    SELECT owner_id, count(*) FROM s GROUP BY owner_id ORDER BY owner_id
    ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
    RETURNING owner_id, last_id, pg_notify('ferryman', 'o:' || c.owner_id) IS NOT NULL AS notified
), owner_appended AS (
    INSERT INTO owner_events (owner_id, id, session_id, type, data)
    SELECT s.owner_id,
           c.last_id - count(*) OVER owner
               + row_number() OVER (owner ORDER BY s.created_at, s.id),
           s.id, 'session_created', jsonb_build_object('session', %(view)s::jsonb || jsonb_build_object('createdAt', to_char(s.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), 'updatedAt', to_char(s.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')))
    FROM s s JOIN owner_cursor c ON c.owner_id = s.owner_id
    WINDOW owner AS (PARTITION BY s.owner_id)
    RETURNING id
)
SELECT * FROM s;

-- name: create_one_off_webhook
INSERT INTO webhooks (id, owner_id, url, events, secret, session_id, run_start_seq)
VALUES (%(id)s, %(owner)s, %(url)s, '{session_end}', %(secret)s, %(session)s, %(seq)s);

-- name: create_session
INSERT INTO sessions (id, owner_id, title, status, model, prompt, script, tools, metadata,
                      instructions, model_settings, approval_required, assistant_id,
                      assistant_version, client_tools, compaction, schedule_id,
                      schedule_fired_at, delegates, parent_session_id, parent_tool_call_id,
                      depth, created_by_key_id, priority)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
        %s, %s, %s)
ON CONFLICT (parent_session_id, parent_tool_call_id) WHERE parent_session_id IS NOT NULL
DO NOTHING
RETURNING
id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
created_by_key_id, priority;

-- name: create_sessions
WITH c AS (
    SELECT * FROM unnest(%(id)b::text[], %(owner_id)b::text[], %(title)b::text[], %(status)b::text[], %(model)b::text[], %(prompt)b::text[], %(script)b::text[], %(tools)b::text[], %(metadata)b::text[], %(instructions)b::text[], %(model_settings)b::text[], %(approval_required)b::text[], %(assistant_id)b::text[], %(assistant_version)b::text[], %(client_tools)b::text[], %(compaction)b::text[], %(delegates)b::text[], %(last_seq)b::text[], %(created_by_key_id)b::text[], %(priority)b::text[], %(key)b::text[], %(fingerprint)b::text[], %(opening)b::text[], %(view)b::text[])
    WITH ORDINALITY AS c(id, owner_id, title, status, model, prompt, script, tools, metadata, instructions, model_settings, approval_required, assistant_id, assistant_version, client_tools, compaction, delegates, last_seq, created_by_key_id, priority, key, fingerprint, opening, view, n)
), k AS (
    INSERT INTO idempotency_keys (owner_id, key, request_hash, session_id)
    SELECT c.owner_id, c.key, c.fingerprint, c.id::uuid FROM c
    WHERE c.key IS NOT NULL ORDER BY c.n
    ON CONFLICT DO NOTHING
    RETURNING session_id
), s AS (
    INSERT INTO sessions (id, owner_id, title, status, model, prompt, script, tools, metadata, instructions, model_settings, approval_required, assistant_id, assistant_version, client_tools, compaction, delegates, last_seq, created_by_key_id, priority)
    SELECT c.id::uuid, c.owner_id::text, c.title::text, c.status::text, c.model::text, c.prompt::text, c.script::jsonb, c.tools::jsonb, c.metadata::jsonb, c.instructions::text, c.model_settings::jsonb, c.approval_required::jsonb, c.assistant_id::uuid, c.assistant_version::integer, c.client_tools::jsonb, c.compaction::jsonb, c.delegates::jsonb, c.last_seq::bigint, c.created_by_key_id::uuid, c.priority::integer
    FROM c WHERE c.key IS NULL OR c.id::uuid IN (SELECT session_id FROM k) ORDER BY c.n
    RETURNING
id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
created_by_key_id, priority

), opening AS (
    INSERT INTO session_events (session_id, seq, attempt, type, data)
    SELECT s.id, 1, s.attempt, 'user_message', c.opening::jsonb
    FROM s JOIN c ON c.id::uuid = s.id WHERE s.last_seq = 1
),
owner_cursor AS (
    INSERT INTO owner_cursors AS c (owner_id, last_id)
    SELECT owner_id, count(*) FROM s GROUP BY owner_id ORDER BY owner_id
    ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
    RETURNING owner_id, last_id, pg_notify('ferryman', 'o:' || c.owner_id) IS NOT NULL AS notified
), owner_appended AS (
    INSERT INTO owner_events (owner_id, id, session_id, type, data)
    SELECT s.owner_id,
           c.last_id - count(*) OVER owner
               + row_number() OVER (owner ORDER BY s.created_at, s.id),
           s.id, 'session_created', jsonb_build_object('session', (SELECT c.view::jsonb FROM c WHERE c.id::uuid = s.id) || jsonb_build_object('createdAt', to_char(s.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), 'updatedAt', to_char(s.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')))
    FROM s s JOIN owner_cursor c ON c.owner_id = s.owner_id
    WINDOW owner AS (PARTITION BY s.owner_id)
    RETURNING id
)
SELECT * FROM s
WHERE s.status <> 'queued' OR pg_notify('ferryman_runs', 'work') IS NOT NULL;

-- name: create_webhook
INSERT INTO webhooks (id, owner_id, url, events, secret)
VALUES (%(id)s, %(owner)s, %(url)s, %(events)s, %(secret)s)
RETURNING id, owner_id, url, events, created_at, updated_at;

-- name: delegate_graph
SELECT a.id::text AS id, v.delegates
FROM assistants a JOIN assistant_versions v ON v.assistant_id = a.id AND v.version = a.version
WHERE a.owner_id = %s AND a.deleted_at IS NULL AND v.delegates IS NOT NULL;

-- name: delegate_names
SELECT a.id, v.name, v.description
FROM assistants a JOIN assistant_versions v ON v.assistant_id = a.id AND v.version = a.version
WHERE a.owner_id = %s AND a.id = ANY(%s::uuid[]) AND a.deleted_at IS NULL;

-- name: deliver_one_off_webhook
WITH spent AS (
    UPDATE webhooks SET events = '{}' WHERE id = %(id)s AND events <> '{}' RETURNING id
)
INSERT INTO webhook_deliveries (webhook_id, session_id, type, event)
SELECT spent.id, %(session)s, 'session_end', %(event)s FROM spent;

-- name: ended_stateless_threads
SELECT id, owner_id FROM sessions
WHERE deleted_at IS NULL AND metadata @> '{"stateless": true, "on_completion": "delete"}'::jsonb
  AND status NOT IN ('queued', 'running') AND updated_at < clock_timestamp() - %(grace)s
ORDER BY updated_at LIMIT %(limit)s;

-- name: fork_event_at
SELECT type, data FROM session_events WHERE session_id = %s AND seq = %s;

-- name: fork_session
WITH forked AS (
    INSERT INTO sessions (id, owner_id, title, status, model, prompt, script, tools, metadata,
                          instructions, model_settings, approval_required, assistant_id,
                          assistant_version, client_tools, compaction, delegates,
                          last_seq, delivered_seq, forked_from_session_id, forked_from_seq,
                          created_by_key_id, priority)
    SELECT %(id)s, p.owner_id, coalesce(%(title)s, p.title), %(status)s, p.model,
           coalesce(%(prompt)s, p.prompt), p.script, p.tools,
           p.metadata - '{stateless,on_completion}'::text[], p.instructions,
           p.model_settings, p.approval_required, p.assistant_id, p.assistant_version,
           p.client_tools, p.compaction, p.delegates, %(copy)s,
           least(p.delivered_seq, %(copy)s), p.id, %(at)s, %(key)s, p.priority
    FROM sessions p WHERE p.id = %(parent)s
    RETURNING
id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
created_by_key_id, priority

), copied AS (
    INSERT INTO session_events (session_id, seq, attempt, type, data, created_at)
    SELECT f.id, e.seq, 0, e.type, e.data, e.created_at
    FROM session_events e CROSS JOIN forked f
    WHERE e.session_id = %(parent)s AND e.seq <= %(copy)s
), noted AS (
    INSERT INTO notes (session_id, key, text, attempt)
    SELECT DISTINCT ON (c.data->'arguments'->>'key') f.id, c.data->'arguments'->>'key',
           c.data->'arguments'->>'text', 0
    FROM session_events c
    JOIN session_events r ON r.session_id = c.session_id
         AND r.type = 'tool_result' AND r.seq <= %(copy)s
         AND r.data->>'toolCallId' = c.data->>'toolCallId' AND r.data->>'isError' = 'false'
    CROSS JOIN forked f
    WHERE c.session_id = %(parent)s AND c.seq <= %(copy)s
      AND c.type = 'tool_call_start' AND c.data->>'name' = 'put_note'
      AND c.data->'arguments'->>'text' IS NOT NULL
    ORDER BY c.data->'arguments'->>'key', r.seq DESC
)
SELECT * FROM forked;

-- name: get_assistant
SELECT
a.id, a.owner_id, v.version, a.created_at, v.created_at AS updated_at, v.name,
v.description, v.model, v.instructions, v.model_settings, v.tools, v.approval_required,
v.metadata, v.compaction, v.delegates, v.script

FROM assistants a
JOIN assistant_versions v
  ON v.assistant_id = a.id AND v.version = coalesce(%(version)s, a.version)
WHERE a.id = %(id)s AND a.owner_id = %(owner)s AND a.deleted_at IS NULL;

-- name: get_schedule
SELECT
    id, owner_id, cron, timezone, enabled, overlap, title, prompt, request, definition,
    next_run_at, pending_tick, last_session_id, session_id, end_time, agent_protocol,
    created_at, updated_at
 FROM schedules WHERE id = %s AND owner_id = %s;

-- name: get_schedule_for_update
SELECT
    id, owner_id, cron, timezone, enabled, overlap, title, prompt, request, definition,
    next_run_at, pending_tick, last_session_id, session_id, end_time, agent_protocol,
    created_at, updated_at
 FROM schedules WHERE id = %s AND owner_id = %s FOR UPDATE;

-- name: get_session
SELECT
   id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
   error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
   delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
   approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
   assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
   schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
   created_by_key_id, priority
FROM sessions
   WHERE id = %s AND owner_id = %s AND deleted_at IS NULL;

-- name: get_session_for_update
SELECT
   id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
   error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
   delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
   approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
   assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
   schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
   created_by_key_id, priority
FROM sessions
   WHERE id = %s AND owner_id = %s AND deleted_at IS NULL FOR UPDATE;

-- name: get_webhook
SELECT id, owner_id, url, events, created_at, updated_at FROM webhooks WHERE id = %s AND owner_id = %s;

-- name: insert_assistant_version
INSERT INTO assistant_versions (assistant_id, version, name, description, model,
                                instructions, model_settings, tools, approval_required,
                                metadata, compaction, delegates, script)
VALUES (%(id)s, %(version)s, %(name)s, %(description)s, %(model)s, %(instructions)s,
        %(model_settings)s, %(tools)s, %(approval_required)s, %(metadata)s, %(compaction)s,
        %(delegates)s, %(script)s);

-- name: insert_schedule
INSERT INTO schedules (id, owner_id, cron, timezone, enabled, overlap, title, prompt, request, definition, next_run_at, pending_tick, session_id, end_time, agent_protocol)
VALUES (%(id)s, %(owner)s, %(cron)s, %(timezone)s, %(enabled)s, %(overlap)s, %(title)s, %(prompt)s, %(request)s, %(definition)s, %(next_run_at)s, %(pending_tick)s, %(session_id)s, %(end_time)s, %(agent_protocol)s)
RETURNING
id, owner_id, cron, timezone, enabled, overlap, title, prompt, request, definition,
next_run_at, pending_tick, last_session_id, session_id, end_time, agent_protocol,
created_at, updated_at;

-- name: list_schedules
SELECT
   id, owner_id, cron, timezone, enabled, overlap, title, prompt, request, definition,
   next_run_at, pending_tick, last_session_id, session_id, end_time, agent_protocol,
   created_at, updated_at
FROM schedules
   WHERE owner_id = %(owner)s
     AND (%(after_ts)s::timestamptz IS NULL OR (created_at, id) < (%(after_ts)s, %(after_id)s))
   ORDER BY created_at DESC, id DESC
   LIMIT %(limit)s;

-- name: list_sessions
SELECT id, owner_id, title, status, attempt, model, left(prompt, %(excerpt)s::int + 1) AS prompt, script, tools, metadata, active_stage, error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq, delivered_seq, created_at, updated_at, deleted_at, left(instructions, %(excerpt)s::int + 1) AS instructions, model_settings, approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id, assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq, schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth, created_by_key_id, priority FROM sessions
WHERE owner_id = %(owner)s AND deleted_at IS NULL
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(after_ts)s::timestamptz IS NULL OR (created_at, id) < (%(after_ts)s, %(after_id)s))
  AND (%(pattern)s::text IS NULL OR title ILIKE %(pattern)s)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: list_webhooks
SELECT id, owner_id, url, events, created_at, updated_at FROM webhooks WHERE owner_id = %s AND session_id IS NULL
ORDER BY created_at DESC, id DESC;

-- name: listen_ferryman
LISTEN ferryman;

-- name: listen_ferryman_runs
LISTEN ferryman_runs;

-- name: live_children
SELECT id, status FROM sessions WHERE parent_session_id = %s AND deleted_at IS NULL
ORDER BY created_at, id;

-- name: live_tool_catalog
WITH live AS (
    SELECT id, started_at FROM workers
    WHERE stopped_at IS NULL AND heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s)
)
    SELECT DISTINCT ON (t.name) t.name, t.description, t.parameters, t.idempotent,
           t.requires_approval, t.source, count(*) OVER (PARTITION BY t.name) AS workers
    FROM worker_tools t JOIN live ON live.id = t.worker_id
    ORDER BY t.name, live.started_at DESC;

-- name: live_worker_count
SELECT count(*) AS n FROM (
    SELECT id, started_at FROM workers
    WHERE stopped_at IS NULL AND heartbeat_at > clock_timestamp() - make_interval(secs => %(ttl)s)
) live;

-- name: lock_assistant
SELECT version FROM assistants
WHERE id = %s AND owner_id = %s AND deleted_at IS NULL FOR UPDATE;

-- name: lock_due_schedule
WITH t AS (SELECT clock_timestamp() AS now)
SELECT sc.id, sc.owner_id, sc.cron, sc.timezone, sc.enabled, sc.overlap, sc.title, sc.prompt, sc.request, sc.definition, sc.next_run_at, sc.pending_tick, sc.last_session_id, sc.session_id, sc.end_time, sc.agent_protocol, sc.created_at, sc.updated_at,
       t.now, s.status AS last_status
FROM t, schedules sc
    LEFT JOIN sessions s ON s.id = coalesce(sc.session_id, sc.last_session_id)
WHERE sc.enabled
  AND (sc.next_run_at <= t.now
       OR (sc.pending_tick IS NOT NULL AND (s.status IS NULL OR s.status IN ('cancelled', 'failed', 'idle', 'succeeded'))))
ORDER BY sc.next_run_at
LIMIT 1
FOR UPDATE OF sc SKIP LOCKED;

-- name: lock_for_finish
SELECT cancel_requested_at IS NOT NULL AS cancel, lease_worker_id = %(worker_id)s AND attempt = %(attempt)s AND lease_expires_at > clock_timestamp() AS held FROM sessions
WHERE id = %(session_id)s FOR UPDATE;

-- name: lock_parent
SELECT FROM sessions
WHERE id = (SELECT parent_session_id FROM sessions WHERE id = %s) FOR UPDATE;

-- name: merge_thread_metadata
UPDATE sessions SET metadata = metadata || %s, updated_at = clock_timestamp()
WHERE id = %s RETURNING
id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
created_by_key_id, priority;

-- name: open_turn_chunks
WITH turn AS (
    SELECT max(after_seq) AS after_seq FROM session_deltas
    WHERE session_id = %(session_id)s AND after_seq <= %(cursor)s
)
SELECT turn.after_seq, d.chunk, d.text, d.created_at
FROM turn LEFT JOIN session_deltas d
    ON d.session_id = %(session_id)s AND d.after_seq = turn.after_seq
    AND d.chunk > CASE WHEN turn.after_seq <= %(seen_seq)s THEN %(seen_chunk)s ELSE 0 END
WHERE turn.after_seq IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM session_events e
    WHERE e.session_id = %(session_id)s AND e.seq > turn.after_seq AND e.seq <= %(cursor)s
        AND e.type IN ('assistant_message', 'model_retry', 'session_end')
)
ORDER BY d.chunk;

-- name: owner_pages
SELECT want.key AS want_key, want.after, want.max_bytes, want.key AS owner_id, page.id, page.session_id, page.type, page.data, page.created_at, page.epoch, false AS deleted, page.size,
    (SELECT at.epoch FROM owner_events at WHERE at.owner_id = want.key AND at.id = want.after)
        AS after_epoch
FROM unnest(%(keys)s::text[], %(afters)s::bigint[], %(max_bytes)s::bigint[])
    AS want(key, after, max_bytes)

LEFT JOIN LATERAL (
    SELECT log.*, sum(log.size) OVER (ORDER BY log.id) AS upto FROM owner_events log
    WHERE log.owner_id = want.key AND log.id > want.after
    ORDER BY log.id LIMIT %(limit)s
) page ON true
WHERE page.id IS NULL OR page.upto - page.size < want.max_bytes
ORDER BY want.key, want.after, want.max_bytes, page.id;

-- name: owner_queued
SELECT count(*) AS queued FROM (
    SELECT 1 FROM sessions
    WHERE owner_id = %(owner)s AND status = 'queued' AND deleted_at IS NULL
    LIMIT %(limit)s) q;

-- name: owner_queues_top
WITH q AS (
    SELECT owner_id, count(*) AS depth,
           extract(epoch FROM clock_timestamp() - min(updated_at)) AS oldest
    FROM sessions WHERE status = 'queued' AND deleted_at IS NULL
    GROUP BY owner_id
), ranked AS (
    SELECT q.*, row_number() OVER (ORDER BY depth DESC, owner_id) AS rank FROM q
)
SELECT CASE WHEN rank <= %(top)s THEN owner_id ELSE 'other' END AS owner,
       sum(depth)::bigint AS depth, max(oldest)::float8 AS oldest
FROM ranked GROUP BY 1;

-- name: owner_running
SELECT count(*) AS running FROM sessions WHERE owner_id = %s AND status = 'running';

-- name: parent_for_answer
SELECT p.id, p.status, (
    SELECT e.data->>'text' FROM session_events e
    WHERE e.session_id = %(child)s AND e.type = 'assistant_message'
    ORDER BY e.seq DESC LIMIT 1) AS answer
FROM sessions p WHERE p.id = %(parent)s AND p.deleted_at IS NULL;

-- name: pending_approvals
SELECT s.id AS session_id, s.title, e.seq, e.data, e.created_at
FROM sessions s
JOIN session_events e ON e.session_id = s.id
     AND e.type = 'tool_approval_requested'
WHERE s.owner_id = %s AND s.deleted_at IS NULL AND s.status NOT IN ('cancelled', 'failed', 'succeeded')
  AND NOT EXISTS (
      SELECT 1 FROM session_events d
      WHERE d.session_id = e.session_id AND d.seq > e.seq
        AND d.type IN ('tool_approval_decided',
                       'tool_result')
        AND d.data->>'toolCallId' = e.data->>'toolCallId'
  )
ORDER BY e.created_at, s.id, e.seq
LIMIT %s;

-- name: prune_one_off_webhooks
DELETE FROM webhooks w
WHERE w.session_id IS NOT NULL
  AND NOT EXISTS (SELECT FROM webhook_deliveries d WHERE d.webhook_id = w.id)
  AND (w.events = '{}' OR NOT EXISTS (SELECT FROM sessions s WHERE s.id = w.session_id));

-- name: prune_schedule_firings
DELETE FROM schedule_firings WHERE schedule_id = %(schedule)s AND tick < (
    SELECT tick FROM schedule_firings WHERE schedule_id = %(schedule)s
    ORDER BY tick DESC OFFSET 9 LIMIT 1
);

-- name: prune_webhook_deliveries
DELETE FROM webhook_deliveries
WHERE coalesce(delivered_at, abandoned_at) < clock_timestamp() - make_interval(secs => %s);

-- name: publish_deltas
WITH chunk AS (
    SELECT * FROM unnest(
        %(sessions)b::uuid[], %(afters)b::bigint[], %(chunks)b::integer[], %(texts)b::text[]
    ) AS c (session_id, after_seq, chunk, text)
), stored AS (
    INSERT INTO session_deltas (session_id, after_seq, chunk, text, created_at)
    SELECT session_id, after_seq, chunk, text, %(ts)s FROM chunk
    ON CONFLICT DO NOTHING
)
SELECT pg_notify('ferryman', payload) FROM unnest(%(payloads)b::text[]) AS payload;

-- name: publish_deltas_and_sweep
WITH chunk AS (
    SELECT * FROM unnest(
        %(sessions)b::uuid[], %(afters)b::bigint[], %(chunks)b::integer[], %(texts)b::text[]
    ) AS c (session_id, after_seq, chunk, text)
), stored AS (
    INSERT INTO session_deltas (session_id, after_seq, chunk, text, created_at)
    SELECT session_id, after_seq, chunk, text, %(ts)s FROM chunk
    ON CONFLICT DO NOTHING
), swept AS (
    DELETE FROM session_deltas WHERE created_at < %(ts)s - %(max_age)s * interval '1 second'
)
SELECT pg_notify('ferryman', payload) FROM unnest(%(payloads)b::text[]) AS payload;

-- name: record_schedule_firing
INSERT INTO schedule_firings (schedule_id, tick, outcome, catch_up, session_id, detail)
VALUES (%(schedule)s, %(tick)s, %(outcome)s, %(catch_up)s, %(session)s, %(detail)s)
ON CONFLICT (schedule_id, tick) DO UPDATE
    SET outcome = excluded.outcome, session_id = excluded.session_id,
        detail = excluded.detail, at = clock_timestamp();

-- name: record_webhook_attempt
UPDATE webhook_deliveries
SET last_status = %(status)s, last_error = %(error)s,
    delivered_at = CASE WHEN %(ok)s THEN clock_timestamp() END,
    abandoned_at = CASE
        WHEN NOT %(ok)s AND created_at + make_interval(secs => %(max_age)s)
             < clock_timestamp() + make_interval(secs => %(delay)s)
        THEN clock_timestamp() END,
    next_attempt_at = clock_timestamp() + make_interval(secs => %(delay)s)
WHERE id = %(id)s AND attempts = %(attempt)s;

-- name: redefine_thread
UPDATE sessions SET model = %(model)s, script = %(script)s, tools = %(tools)s,
                    instructions = %(instructions)s, model_settings = %(model_settings)s,
                    approval_required = %(approval_required)s,
                    client_tools = %(client_tools)s, compaction = %(compaction)s,
                    delegates = %(delegates)s,
                    assistant_id = %(assistant_id)s, assistant_version = %(assistant_version)s,
                    updated_at = clock_timestamp()
WHERE id = %(id)s RETURNING
id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
created_by_key_id, priority;

-- name: rename_session
UPDATE sessions SET title = %s, updated_at = clock_timestamp() WHERE id = %s
RETURNING
id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
created_by_key_id, priority;

-- name: request_cancel
UPDATE sessions SET cancel_requested_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE id = %s RETURNING
id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
created_by_key_id, priority;

-- name: rotate_run_webhook_secret
INSERT INTO webhook_run_secrets (owner_id, secret) VALUES (%(owner)s, %(secret)s)
ON CONFLICT (owner_id) DO UPDATE
    SET secret = excluded.secret, created_at = clock_timestamp()
RETURNING secret, created_at;

-- name: run_end_since
SELECT seq, type, data, created_at FROM session_events
WHERE session_id = %s AND type = 'session_end' AND seq > %s
ORDER BY seq LIMIT 1;

-- name: run_webhook_secret
WITH made AS (
    INSERT INTO webhook_run_secrets (owner_id, secret) VALUES (%(owner)s, %(secret)s)
    ON CONFLICT (owner_id) DO NOTHING
    RETURNING secret
)
SELECT secret FROM made
UNION ALL SELECT secret FROM webhook_run_secrets WHERE owner_id = %(owner)s
LIMIT 1;

-- name: run_write
WITH bumped AS (
    UPDATE sessions SET
        last_seq = last_seq + %(n)s, updated_at = clock_timestamp(),
        delivered_seq = greatest(delivered_seq, %(delivered_seq)s::bigint),
        input_tokens = input_tokens + %(input_tokens)s,
        output_tokens = output_tokens + %(output_tokens)s,
        cached_tokens = cached_tokens + %(cached_tokens)s,
        active_stage = CASE WHEN %(status)s::text IS NULL
                            THEN coalesce(%(active_stage)s::text, active_stage) END,
        status = coalesce(%(status)s::text, status),
        error = CASE WHEN %(status)s::text IS NULL THEN error ELSE %(error)s::jsonb END,
        lease_worker_id = CASE WHEN %(lease_released)s THEN NULL ELSE lease_worker_id END,
        lease_pid = CASE WHEN %(lease_released)s THEN NULL ELSE lease_pid END,
        lease_expires_at = CASE WHEN %(lease_released)s THEN NULL ELSE lease_expires_at END
    WHERE id = %(session_id)s AND CASE WHEN lease_worker_id = %(worker_id)s AND attempt = %(attempt)s AND lease_expires_at > clock_timestamp() THEN true ELSE ferryman_fence_refused(id) END
    RETURNING id, owner_id, last_seq, attempt
), appended AS (
    INSERT INTO session_events (session_id, seq, attempt, type, data)
    SELECT b.id, b.last_seq - %(n)s + e.ord, b.attempt, e.type, e.data
    FROM bumped b,
         unnest(%(types)s::text[], %(datas)b::jsonb[]) WITH ORDINALITY AS e(type, data, ord)
    RETURNING seq
), noted AS (
    INSERT INTO notes (session_id, key, text, attempt)
    SELECT b.id, n.key, n.text, b.attempt
    FROM bumped b, unnest(%(note_keys)b::text[], %(note_texts)b::text[]) AS n(key, text)
    ON CONFLICT (session_id, key) DO UPDATE
        SET text = excluded.text, attempt = excluded.attempt, updated_at = clock_timestamp()
), notified AS MATERIALIZED (
    SELECT count(pg_notify('ferryman', payload)) AS n
    FROM unnest(%(payloads)b::text[] || %(notify_key)s::text) AS payload
    WHERE EXISTS (SELECT FROM bumped)
), owner_rows AS (
    SELECT b.owner_id, b.id, o.ord, o.type, o.data
    FROM bumped b,
         unnest(%(owner_types)s::text[], %(owner_datas)b::jsonb[])
             WITH ORDINALITY AS o(type, data, ord)
),
owner_cursor AS (
    INSERT INTO owner_cursors AS c (owner_id, last_id)
    SELECT owner_id, count(*) FROM owner_rows GROUP BY owner_id ORDER BY owner_id
    ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
    RETURNING owner_id, last_id, pg_notify('ferryman', 'o:' || c.owner_id) IS NOT NULL AS notified
), owner_appended AS (
    INSERT INTO owner_events (owner_id, id, session_id, type, data)
    SELECT s.owner_id,
           c.last_id - count(*) OVER owner
               + row_number() OVER (owner ORDER BY s.ord),
           s.id, s.type, s.data
    FROM owner_rows s JOIN owner_cursor c ON c.owner_id = s.owner_id
    WINDOW owner AS (PARTITION BY s.owner_id)
    RETURNING id
)
SELECT (SELECT count(*) FROM bumped) AS written, (SELECT max(seq) FROM appended) AS seq,
       (SELECT n FROM notified) AS notified;

-- name: run_write_if_log_ends
WITH bumped AS (
    UPDATE sessions SET
        last_seq = last_seq + %(n)s, updated_at = clock_timestamp(),
        delivered_seq = greatest(delivered_seq, %(delivered_seq)s::bigint),
        input_tokens = input_tokens + %(input_tokens)s,
        output_tokens = output_tokens + %(output_tokens)s,
        cached_tokens = cached_tokens + %(cached_tokens)s,
        active_stage = CASE WHEN %(status)s::text IS NULL
                            THEN coalesce(%(active_stage)s::text, active_stage) END,
        status = coalesce(%(status)s::text, status),
        error = CASE WHEN %(status)s::text IS NULL THEN error ELSE %(error)s::jsonb END,
        lease_worker_id = CASE WHEN %(lease_released)s THEN NULL ELSE lease_worker_id END,
        lease_pid = CASE WHEN %(lease_released)s THEN NULL ELSE lease_pid END,
        lease_expires_at = CASE WHEN %(lease_released)s THEN NULL ELSE lease_expires_at END
    WHERE id = %(session_id)s AND CASE WHEN lease_worker_id = %(worker_id)s AND attempt = %(attempt)s AND lease_expires_at > clock_timestamp() THEN true ELSE ferryman_fence_refused(id) END
      AND last_seq = %(expected_last_seq)s AND cancel_requested_at IS NULL
      AND NOT EXISTS (
    SELECT FROM session_events e WHERE e.session_id = sessions.id
      AND e.type IN ('user_message', 'tool_approval_decided', 'client_tool_result',
                     'delegate_result')
      AND e.seq > greatest(sessions.delivered_seq, %(delivered_seq)s::bigint))
    RETURNING id, owner_id, last_seq, attempt
), appended AS (
    INSERT INTO session_events (session_id, seq, attempt, type, data)
    SELECT b.id, b.last_seq - %(n)s + e.ord, b.attempt, e.type, e.data
    FROM bumped b,
         unnest(%(types)s::text[], %(datas)b::jsonb[]) WITH ORDINALITY AS e(type, data, ord)
    RETURNING seq
), noted AS (
    INSERT INTO notes (session_id, key, text, attempt)
    SELECT b.id, n.key, n.text, b.attempt
    FROM bumped b, unnest(%(note_keys)b::text[], %(note_texts)b::text[]) AS n(key, text)
    ON CONFLICT (session_id, key) DO UPDATE
        SET text = excluded.text, attempt = excluded.attempt, updated_at = clock_timestamp()
), notified AS MATERIALIZED (
    SELECT count(pg_notify('ferryman', payload)) AS n
    FROM unnest(%(payloads)b::text[] || %(notify_key)s::text) AS payload
    WHERE EXISTS (SELECT FROM bumped)
), owner_rows AS (
    SELECT b.owner_id, b.id, o.ord, o.type, o.data
    FROM bumped b,
         unnest(%(owner_types)s::text[], %(owner_datas)b::jsonb[])
             WITH ORDINALITY AS o(type, data, ord)
),
owner_cursor AS (
    INSERT INTO owner_cursors AS c (owner_id, last_id)
    SELECT owner_id, count(*) FROM owner_rows GROUP BY owner_id ORDER BY owner_id
    ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
    RETURNING owner_id, last_id, pg_notify('ferryman', 'o:' || c.owner_id) IS NOT NULL AS notified
), owner_appended AS (
    INSERT INTO owner_events (owner_id, id, session_id, type, data)
    SELECT s.owner_id,
           c.last_id - count(*) OVER owner
               + row_number() OVER (owner ORDER BY s.ord),
           s.id, s.type, s.data
    FROM owner_rows s JOIN owner_cursor c ON c.owner_id = s.owner_id
    WINDOW owner AS (PARTITION BY s.owner_id)
    RETURNING id
)
SELECT (SELECT count(*) FROM bumped) AS written, (SELECT max(seq) FROM appended) AS seq,
       (SELECT n FROM notified) AS notified;

-- name: schedule_firings
SELECT f.schedule_id, f.tick, f.at, f.outcome, f.catch_up, f.session_id, f.detail,
       s.status AS session_status
FROM schedule_firings f LEFT JOIN sessions s ON s.id = f.session_id
WHERE f.schedule_id = ANY(%s)
ORDER BY f.schedule_id, f.tick DESC;

-- name: search_assistants
SELECT
a.id, a.owner_id, v.version, a.created_at, v.created_at AS updated_at, v.name,
v.description, v.model, v.instructions, v.model_settings, v.tools, v.approval_required,
v.metadata, v.compaction, v.delegates, v.script

FROM assistants a
JOIN assistant_versions v ON v.assistant_id = a.id AND v.version = a.version
WHERE a.owner_id = %(owner)s AND a.deleted_at IS NULL
  AND (%(after_ts)s::timestamptz IS NULL OR (a.created_at, a.id) < (%(after_ts)s, %(after_id)s))
  AND (%(pattern)s::text IS NULL OR v.name ILIKE %(pattern)s)
  AND (%(exact)s::text IS NULL OR v.name = %(exact)s)
  AND (%(metadata)s::jsonb IS NULL OR v.metadata @> %(metadata)s::jsonb)
ORDER BY a.created_at DESC, a.id DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: search_threads_created_at_asc
SELECT id, owner_id, title, status, attempt, model, left(prompt, %(excerpt)s::int + 1) AS prompt, script, tools, metadata, active_stage, error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq, delivered_seq, created_at, updated_at, deleted_at, left(instructions, %(excerpt)s::int + 1) AS instructions, model_settings, approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id, assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq, schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth, created_by_key_id, priority FROM sessions
WHERE owner_id = %(owner)s AND deleted_at IS NULL
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb)
  AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
ORDER BY created_at ASC, id ASC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: search_threads_created_at_desc
SELECT id, owner_id, title, status, attempt, model, left(prompt, %(excerpt)s::int + 1) AS prompt, script, tools, metadata, active_stage, error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq, delivered_seq, created_at, updated_at, deleted_at, left(instructions, %(excerpt)s::int + 1) AS instructions, model_settings, approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id, assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq, schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth, created_by_key_id, priority FROM sessions
WHERE owner_id = %(owner)s AND deleted_at IS NULL
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb)
  AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: search_threads_id_asc
SELECT id, owner_id, title, status, attempt, model, left(prompt, %(excerpt)s::int + 1) AS prompt, script, tools, metadata, active_stage, error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq, delivered_seq, created_at, updated_at, deleted_at, left(instructions, %(excerpt)s::int + 1) AS instructions, model_settings, approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id, assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq, schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth, created_by_key_id, priority FROM sessions
WHERE owner_id = %(owner)s AND deleted_at IS NULL
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb)
  AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
ORDER BY id ASC, id ASC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: search_threads_id_desc
SELECT id, owner_id, title, status, attempt, model, left(prompt, %(excerpt)s::int + 1) AS prompt, script, tools, metadata, active_stage, error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq, delivered_seq, created_at, updated_at, deleted_at, left(instructions, %(excerpt)s::int + 1) AS instructions, model_settings, approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id, assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq, schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth, created_by_key_id, priority FROM sessions
WHERE owner_id = %(owner)s AND deleted_at IS NULL
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb)
  AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
ORDER BY id DESC, id DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: search_threads_status_asc
SELECT id, owner_id, title, status, attempt, model, left(prompt, %(excerpt)s::int + 1) AS prompt, script, tools, metadata, active_stage, error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq, delivered_seq, created_at, updated_at, deleted_at, left(instructions, %(excerpt)s::int + 1) AS instructions, model_settings, approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id, assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq, schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth, created_by_key_id, priority FROM sessions
WHERE owner_id = %(owner)s AND deleted_at IS NULL
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb)
  AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
ORDER BY status ASC, id ASC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: search_threads_status_desc
SELECT id, owner_id, title, status, attempt, model, left(prompt, %(excerpt)s::int + 1) AS prompt, script, tools, metadata, active_stage, error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq, delivered_seq, created_at, updated_at, deleted_at, left(instructions, %(excerpt)s::int + 1) AS instructions, model_settings, approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id, assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq, schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth, created_by_key_id, priority FROM sessions
WHERE owner_id = %(owner)s AND deleted_at IS NULL
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb)
  AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
ORDER BY status DESC, id DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: search_threads_updated_at_asc
SELECT id, owner_id, title, status, attempt, model, left(prompt, %(excerpt)s::int + 1) AS prompt, script, tools, metadata, active_stage, error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq, delivered_seq, created_at, updated_at, deleted_at, left(instructions, %(excerpt)s::int + 1) AS instructions, model_settings, approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id, assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq, schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth, created_by_key_id, priority FROM sessions
WHERE owner_id = %(owner)s AND deleted_at IS NULL
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb)
  AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
ORDER BY updated_at ASC, id ASC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: search_threads_updated_at_desc
SELECT id, owner_id, title, status, attempt, model, left(prompt, %(excerpt)s::int + 1) AS prompt, script, tools, metadata, active_stage, error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq, delivered_seq, created_at, updated_at, deleted_at, left(instructions, %(excerpt)s::int + 1) AS instructions, model_settings, approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id, assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq, schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth, created_by_key_id, priority FROM sessions
WHERE owner_id = %(owner)s AND deleted_at IS NULL
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(metadata)s::jsonb IS NULL OR metadata @> %(metadata)s::jsonb)
  AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
ORDER BY updated_at DESC, id DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: session_by_id
SELECT
    id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
    error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
    delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
    approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
    assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
    schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
    created_by_key_id, priority
 FROM sessions WHERE id = %s;

-- name: session_page
SELECT page.session_id, page.seq, page.attempt, page.type, page.data, page.created_at, page.epoch, s.owner_id, s.deleted_at IS NOT NULL AS deleted, page.size FROM (
    SELECT log.*, sum(log.size) OVER (ORDER BY log.seq) AS upto FROM session_events log
    WHERE log.session_id = %(key)s AND log.seq > %(after)s ORDER BY log.seq LIMIT %(limit)s
) page JOIN sessions s ON s.id = page.session_id
WHERE %(max_bytes)s::bigint IS NULL OR page.upto - page.size < %(max_bytes)s
ORDER BY page.seq;

-- name: session_pages
SELECT want.key AS want_key, want.after, want.max_bytes, want.key AS session_id, page.seq, page.attempt, page.type, page.data, page.created_at, page.epoch, s.owner_id, s.deleted_at IS NOT NULL AS deleted, page.size,
    (SELECT at.epoch FROM session_events at WHERE at.session_id = want.key AND at.seq = want.after)
        AS after_epoch
FROM unnest(%(keys)s::uuid[], %(afters)s::bigint[], %(max_bytes)s::bigint[])
    AS want(key, after, max_bytes)
JOIN sessions s ON s.id = want.key
LEFT JOIN LATERAL (
    SELECT log.*, sum(log.size) OVER (ORDER BY log.seq) AS upto FROM session_events log
    WHERE log.session_id = want.key AND log.seq > want.after
    ORDER BY log.seq LIMIT %(limit)s
) page ON true
WHERE page.seq IS NULL OR page.upto - page.size < want.max_bytes
ORDER BY want.key, want.after, want.max_bytes, page.seq;

-- name: set_prompt
UPDATE sessions SET prompt = %s WHERE id = %s;

-- name: set_status
WITH updated AS (
    UPDATE sessions SET status = %s, error = %s, updated_at = clock_timestamp()
    WHERE id = %s RETURNING
id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
created_by_key_id, priority

),
owner_cursor AS (
    INSERT INTO owner_cursors AS c (owner_id, last_id)
    SELECT owner_id, count(*) FROM updated GROUP BY owner_id ORDER BY owner_id
    ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
    RETURNING owner_id, last_id, pg_notify('ferryman', 'o:' || c.owner_id) IS NOT NULL AS notified
), owner_appended AS (
    INSERT INTO owner_events (owner_id, id, session_id, type, data)
    SELECT s.owner_id,
           c.last_id - count(*) OVER owner
               + row_number() OVER (owner ORDER BY s.created_at, s.id),
           s.id, 'session_status', jsonb_build_object('status', s.status, 'attempt', s.attempt) || CASE WHEN s.error IS NULL THEN '{}' ELSE jsonb_build_object('error', s.error) END
    FROM updated s JOIN owner_cursor c ON c.owner_id = s.owner_id
    WINDOW owner AS (PARTITION BY s.owner_id)
    RETURNING id
)
SELECT * FROM updated;

-- name: set_status_cancel_cleared
WITH updated AS (
    UPDATE sessions SET status = %s, error = %s, updated_at = clock_timestamp(), cancel_requested_at = NULL
    WHERE id = %s RETURNING
id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
created_by_key_id, priority

),
owner_cursor AS (
    INSERT INTO owner_cursors AS c (owner_id, last_id)
    SELECT owner_id, count(*) FROM updated GROUP BY owner_id ORDER BY owner_id
    ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
    RETURNING owner_id, last_id, pg_notify('ferryman', 'o:' || c.owner_id) IS NOT NULL AS notified
), owner_appended AS (
    INSERT INTO owner_events (owner_id, id, session_id, type, data)
    SELECT s.owner_id,
           c.last_id - count(*) OVER owner
               + row_number() OVER (owner ORDER BY s.created_at, s.id),
           s.id, 'session_status', jsonb_build_object('status', s.status, 'attempt', s.attempt) || CASE WHEN s.error IS NULL THEN '{}' ELSE jsonb_build_object('error', s.error) END
    FROM updated s JOIN owner_cursor c ON c.owner_id = s.owner_id
    WINDOW owner AS (PARTITION BY s.owner_id)
    RETURNING id
)
SELECT * FROM updated;

-- name: set_status_cancelled
WITH updated AS (
    UPDATE sessions SET status = %s, error = %s, updated_at = clock_timestamp(),
        cancel_requested_at = coalesce(cancel_requested_at, clock_timestamp()),
        lease_worker_id = NULL, lease_pid = NULL, lease_expires_at = NULL
    WHERE id = %s RETURNING
id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
created_by_key_id, priority

),
owner_cursor AS (
    INSERT INTO owner_cursors AS c (owner_id, last_id)
    SELECT owner_id, count(*) FROM updated GROUP BY owner_id ORDER BY owner_id
    ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
    RETURNING owner_id, last_id, pg_notify('ferryman', 'o:' || c.owner_id) IS NOT NULL AS notified
), owner_appended AS (
    INSERT INTO owner_events (owner_id, id, session_id, type, data)
    SELECT s.owner_id,
           c.last_id - count(*) OVER owner
               + row_number() OVER (owner ORDER BY s.created_at, s.id),
           s.id, 'session_status', jsonb_build_object('status', s.status, 'attempt', s.attempt) || CASE WHEN s.error IS NULL THEN '{}' ELSE jsonb_build_object('error', s.error) END
    FROM updated s JOIN owner_cursor c ON c.owner_id = s.owner_id
    WINDOW owner AS (PARTITION BY s.owner_id)
    RETURNING id
)
SELECT * FROM updated;

-- name: start_first_run
WITH s AS (
    UPDATE sessions SET model = %(model)s, script = %(script)s, tools = %(tools)s,
                        instructions = %(instructions)s, model_settings = %(model_settings)s,
                        approval_required = %(approval_required)s, title = %(title)s,
                        client_tools = %(client_tools)s, compaction = %(compaction)s,
                        delegates = %(delegates)s, assistant_id = %(assistant_id)s,
                        assistant_version = %(assistant_version)s, prompt = %(text)s,
                        status = 'queued', error = NULL, cancel_requested_at = NULL,
                        last_seq = 1, updated_at = clock_timestamp()
    WHERE id = %(id)s AND owner_id = %(owner)s AND deleted_at IS NULL
      AND status = 'idle' AND last_seq = 0
    RETURNING
id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
created_by_key_id, priority

), appended AS (
    INSERT INTO session_events (session_id, seq, attempt, type, data)
    SELECT id, last_seq, attempt, 'user_message', %(data)s FROM s
),
owner_cursor AS (
    INSERT INTO owner_cursors AS c (owner_id, last_id)
    SELECT owner_id, count(*) FROM s GROUP BY owner_id ORDER BY owner_id
    ON CONFLICT (owner_id) DO UPDATE SET last_id = c.last_id + excluded.last_id
    RETURNING owner_id, last_id, pg_notify('ferryman', 'o:' || c.owner_id) IS NOT NULL AS notified
), owner_appended AS (
    INSERT INTO owner_events (owner_id, id, session_id, type, data)
    SELECT s.owner_id,
           c.last_id - count(*) OVER owner
               + row_number() OVER (owner ORDER BY s.created_at, s.id),
           s.id, 'session_status', jsonb_build_object('status', s.status, 'attempt', s.attempt) || CASE WHEN s.error IS NULL THEN '{}' ELSE jsonb_build_object('error', s.error) END
    FROM s s JOIN owner_cursor c ON c.owner_id = s.owner_id
    WINDOW owner AS (PARTITION BY s.owner_id)
    RETURNING id
)
SELECT * FROM s
WHERE pg_notify('ferryman', %(session_key)s) IS NOT NULL AND pg_notify('ferryman_runs', 'work') IS NOT NULL;

-- name: thread_run_marks
SELECT seq, type, created_at, data->>'status' AS status,
       data->'runMetadata' AS run_metadata, data->>'multitaskStrategy' AS multitask_strategy
FROM session_events
WHERE session_id = %s AND type IN ('user_message',
    'tool_approval_decided', 'client_tool_result',
    'session_end')
ORDER BY seq;

-- name: update_schedule
UPDATE schedules SET cron = %(cron)s, timezone = %(timezone)s, enabled = %(enabled)s, overlap = %(overlap)s, title = %(title)s, prompt = %(prompt)s, request = %(request)s, definition = %(definition)s, next_run_at = %(next_run_at)s, pending_tick = %(pending_tick)s, session_id = %(session_id)s, end_time = %(end_time)s, agent_protocol = %(agent_protocol)s,
    updated_at = clock_timestamp()
WHERE id = %(id)s AND owner_id = %(owner)s
RETURNING
id, owner_id, cron, timezone, enabled, overlap, title, prompt, request, definition,
next_run_at, pending_tick, last_session_id, session_id, end_time, agent_protocol,
created_at, updated_at;

-- name: update_webhook
UPDATE webhooks SET url = coalesce(%(url)s, url), events = coalesce(%(events)s, events),
                    updated_at = clock_timestamp()
WHERE id = %(id)s AND owner_id = %(owner)s AND session_id IS NULL
RETURNING id, owner_id, url, events, created_at, updated_at;

-- name: webhook_deliveries
SELECT id, session_id, type, created_at, attempts, last_status, last_error,
       last_attempt_at, next_attempt_at, delivered_at, abandoned_at
FROM webhook_deliveries
WHERE webhook_id = %(id)s
  AND (%(after_ts)s::timestamptz IS NULL OR (created_at, id) < (%(after_ts)s, %(after_id)s))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: webhook_sessions
SELECT
    id, owner_id, title, status, attempt, model, prompt, script, tools, metadata, active_stage,
    error, cancel_requested_at, lease_worker_id, lease_pid, lease_expires_at, last_seq,
    delivered_seq, created_at, updated_at, deleted_at, instructions, model_settings,
    approval_required, input_tokens, output_tokens, cached_tokens, resumes, assistant_id,
    assistant_version, client_tools, compaction, forked_from_session_id, forked_from_seq,
    schedule_id, schedule_fired_at, delegates, parent_session_id, parent_tool_call_id, depth,
    created_by_key_id, priority
 FROM sessions WHERE id = ANY(%s);

