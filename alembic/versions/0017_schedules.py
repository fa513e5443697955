"""Schedules: an owner's cron timetables, each firing a session with a stored definition and
prompt. `next_run_at` is the tick the next firing is for (NULL while paused); a firing locks the
row, creates the session and moves `next_run_at` on in one transaction, so each tick fires once
whatever the number of processes. `schedule_firings` keeps each schedule's latest decisions
(fired, skipped, missed, failed); a fired session names its schedule and tick.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE schedules (
            id uuid PRIMARY KEY,
            owner_id text NOT NULL,
            cron text NOT NULL,
            timezone text NOT NULL,
            enabled boolean NOT NULL,
            overlap text NOT NULL CHECK (overlap IN ('skip', 'queue', 'allow')),
            title text,
            prompt text NOT NULL,
            -- The session fields as the request gave them (camelCase), for a PATCH to merge
            -- into, and the definition they resolved to, which each firing copies.
            request jsonb NOT NULL,
            definition jsonb NOT NULL,
            next_run_at timestamptz,
            -- overlap `queue`: the tick of the firing that waits for the last session's end.
            pending_tick timestamptz,
            last_session_id uuid,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
        );
        CREATE INDEX schedules_owner_listing ON schedules (owner_id, created_at DESC, id DESC);
        CREATE INDEX schedules_due ON schedules (next_run_at) WHERE enabled;
        CREATE INDEX schedules_pending ON schedules (id) WHERE pending_tick IS NOT NULL;

        CREATE TABLE schedule_firings (
            schedule_id uuid NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
            tick timestamptz NOT NULL,
            at timestamptz NOT NULL DEFAULT clock_timestamp(),
            outcome text NOT NULL CHECK (outcome IN ('fired', 'skipped', 'queued', 'missed',
                                                     'failed')),
            catch_up boolean NOT NULL DEFAULT false,
            session_id uuid,
            detail text,
            PRIMARY KEY (schedule_id, tick)
        );

        ALTER TABLE sessions
            ADD COLUMN schedule_id uuid,
            ADD COLUMN schedule_fired_at timestamptz;
        -- A tick fires one session, whoever fires it.
        CREATE UNIQUE INDEX sessions_schedule_tick ON sessions (schedule_id, schedule_fired_at)
            WHERE schedule_id IS NOT NULL;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX sessions_schedule_tick;
        ALTER TABLE sessions DROP COLUMN schedule_id, DROP COLUMN schedule_fired_at;
        DROP TABLE schedule_firings;
        DROP TABLE schedules;
        """
    )
