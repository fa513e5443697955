"""Runtime: workers and notes.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE SEQUENCE worker_lock_keys;

        -- A worker holds pg_advisory_lock(<namespace>, lock_key) on its heartbeat connection
        -- for as long as it lives: when its process dies the server drops the connection and
        -- the lock, and a claim can take its sessions at once instead of waiting for the TTL.
        CREATE TABLE workers (
            id text PRIMARY KEY,
            pid integer NOT NULL,
            hostname text NOT NULL,
            lock_key integer NOT NULL DEFAULT nextval('worker_lock_keys')::integer,
            started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            heartbeat_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            stopped_at timestamptz
        );
        CREATE INDEX workers_heartbeat ON workers (heartbeat_at);

        CREATE TABLE notes (
            session_id uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            key text NOT NULL,
            text text NOT NULL,
            attempt integer NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (session_id, key)
        );
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE notes; DROP TABLE workers; DROP SEQUENCE worker_lock_keys;")
