"""Schedules that fire into one session, and the Agent Protocol's crons over schedules.

`session_id`: a schedule bound to a session (a thread's cron) posts its prompt to that session
at each tick, as a follow-up message, instead of creating a session; it goes with the session.
`end_time`: no tick after it fires. `agent_protocol`: what a cron's create gave that the
schedule does not keep otherwise (its assistant id, run payload and metadata), answered back
as the cron's.

Revision ID: 0021
Revises: 0019
Create Date: 2026-12-03
"""

from alembic import op

revision = "0021"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE schedules
            ADD COLUMN session_id uuid REFERENCES sessions (id) ON DELETE CASCADE,
            ADD COLUMN end_time timestamptz,
            ADD COLUMN agent_protocol jsonb;
        CREATE INDEX schedules_session ON schedules (session_id) WHERE session_id IS NOT NULL;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX schedules_session;
        ALTER TABLE schedules
            DROP COLUMN session_id, DROP COLUMN end_time, DROP COLUMN agent_protocol;
        """
    )
