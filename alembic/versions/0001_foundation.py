"""Foundation: sessions, session events, owner events, API keys, idempotency keys.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE sessions (
            id uuid PRIMARY KEY,
            owner_id text NOT NULL,
            title text NOT NULL,
            status text NOT NULL CHECK (status IN
                ('queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')),
            attempt integer NOT NULL DEFAULT 0,
            model text NOT NULL,
            prompt text NOT NULL,
            script jsonb,
            tools jsonb,
            metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
            active_stage text,
            error jsonb,
            cancel_requested_at timestamptz,
            lease_worker_id text,
            lease_pid integer,
            lease_expires_at timestamptz,
            last_seq bigint NOT NULL DEFAULT 0,
            delivered_seq bigint NOT NULL DEFAULT 0,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            deleted_at timestamptz
        );
        CREATE INDEX sessions_owner_listing ON sessions (owner_id, created_at DESC, id DESC)
            WHERE deleted_at IS NULL;
        CREATE INDEX sessions_claimable ON sessions (created_at)
            WHERE status IN ('queued', 'running') AND deleted_at IS NULL;
        CREATE INDEX sessions_deleted ON sessions (deleted_at) WHERE deleted_at IS NOT NULL;

        CREATE TABLE session_events (
            session_id uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            seq bigint NOT NULL,
            attempt integer NOT NULL,
            type text NOT NULL,
            data jsonb NOT NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (session_id, seq)
        );

        -- One counter row per owner: incremented in the transaction that inserts the event,
        -- so the row lock makes ids commit in order.
        CREATE TABLE owner_cursors (
            owner_id text PRIMARY KEY,
            last_id bigint NOT NULL
        );

        CREATE TABLE owner_events (
            owner_id text NOT NULL,
            id bigint NOT NULL,
            session_id uuid NOT NULL,
            type text NOT NULL,
            data jsonb NOT NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (owner_id, id)
        );
        CREATE INDEX owner_events_created ON owner_events (created_at);

        CREATE TABLE api_keys (
            id uuid PRIMARY KEY,
            owner_id text NOT NULL,
            name text NOT NULL DEFAULT '',
            prefix text NOT NULL,
            key_hash text NOT NULL UNIQUE,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            last_used_at timestamptz,
            revoked_at timestamptz
        );

        CREATE TABLE idempotency_keys (
            owner_id text NOT NULL,
            key text NOT NULL,
            request_hash text NOT NULL,
            session_id uuid NOT NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (owner_id, key)
        );
        CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE idempotency_keys;
        DROP TABLE api_keys;
        DROP TABLE owner_events;
        DROP TABLE owner_cursors;
        DROP TABLE session_events;
        DROP TABLE sessions;
        """
    )
