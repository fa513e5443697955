"""Schedules that fire into one session, the Agent Protocol's crons over schedules, and
one-off webhooks (a run create's `webhook`).

`session_id`: a schedule bound to a session (a thread's cron) posts its prompt to that session
at each tick, as a follow-up message, instead of creating a session; it goes with the session.
`end_time`: no tick after it fires. `agent_protocol`: what a cron's create gave that the
schedule does not keep otherwise (its assistant id, run payload and metadata), answered back
as the cron's.

A webhook with a `session_id` is a one-off subscription: the first `session_end` of that
session after `run_start_seq` (the run it was made for ends) is delivered to it once, and it
takes no more (its `events` emptied in the same trigger). Owners' own subscriptions have none,
and only they match an owner's sessions. `webhook_run_secrets`: the secret an owner's run
webhooks are signed with.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03
"""

from alembic import op

revision = "0021"
down_revision = "0020"
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

        ALTER TABLE webhooks ADD COLUMN session_id uuid, ADD COLUMN run_start_seq bigint;
        CREATE INDEX webhooks_session ON webhooks (session_id) WHERE session_id IS NOT NULL;
        CREATE TABLE webhook_run_secrets (
            owner_id text PRIMARY KEY,
            secret text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp()
        );
        """
    )
    op.execute(_session_event_webhooks(one_off=True))


def _session_event_webhooks(*, one_off: bool) -> str:
    """The trigger function of session events (migration 0019's), with one-off webhooks."""
    event = (
        "jsonb_build_object('seq', NEW.seq, 'type', NEW.type, 'data', NEW.data,"
        " 'createdAt', NEW.created_at)"
    )
    owners = "AND w.session_id IS NULL" if one_off else ""
    once = (
        ""
        if not one_off
        else f"""
            IF NEW.type = 'session_end' THEN
                WITH spent AS (
                    UPDATE webhooks SET events = '{{}}'
                    WHERE session_id = NEW.session_id AND events <> '{{}}'
                      AND run_start_seq < NEW.seq
                    RETURNING id
                )
                INSERT INTO webhook_deliveries (webhook_id, session_id, type, event)
                SELECT spent.id, NEW.session_id, NEW.type, {event} FROM spent;
            END IF;"""
    )
    return f"""
        CREATE OR REPLACE FUNCTION ferryman_session_event_webhooks() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO webhook_deliveries (webhook_id, session_id, type, event)
            SELECT w.id, NEW.session_id, NEW.type, {event}
            FROM sessions s JOIN webhooks w ON w.owner_id = s.owner_id
            WHERE s.id = NEW.session_id AND NEW.type = ANY (w.events) {owners};{once}
            RETURN NULL;
        END $$;
        """


def downgrade() -> None:
    op.execute(_session_event_webhooks(one_off=False))
    op.execute(
        """
        DELETE FROM webhooks WHERE session_id IS NOT NULL;
        DROP TABLE webhook_run_secrets;
        DROP INDEX webhooks_session;
        ALTER TABLE webhooks DROP COLUMN session_id, DROP COLUMN run_start_seq;
        DROP INDEX schedules_session;
        ALTER TABLE schedules
            DROP COLUMN session_id, DROP COLUMN end_time, DROP COLUMN agent_protocol;
        """
    )
