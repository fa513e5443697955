"""Webhooks: an owner's subscriptions (`webhooks`) and the outbox of their deliveries
(`webhook_deliveries`, docs/webhooks.md).

A delivery is written by a trigger on the event's own insert, so it commits or rolls back with
the event, and no write path of the runtime knows webhooks exist. The triggers fire only for
the types a subscription may name (the WHEN clause: any other event costs nothing), and then
look up the owner's subscriptions by `webhooks_owner`: with none, one index probe.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE webhooks (
            id uuid PRIMARY KEY,
            owner_id text NOT NULL,
            url text NOT NULL,
            events text[] NOT NULL,
            secret text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
        );
        CREATE INDEX webhooks_owner ON webhooks (owner_id, created_at DESC, id DESC);

        CREATE TABLE webhook_deliveries (
            id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
            webhook_id uuid NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
            session_id uuid NOT NULL,
            type text NOT NULL,
            event jsonb NOT NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            attempts integer NOT NULL DEFAULT 0,
            last_status integer,
            last_error text,
            last_attempt_at timestamptz,
            delivered_at timestamptz,
            abandoned_at timestamptz
        );
        CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
            WHERE delivered_at IS NULL AND abandoned_at IS NULL;
        CREATE INDEX webhook_deliveries_listing
            ON webhook_deliveries (webhook_id, created_at DESC, id DESC);

        CREATE FUNCTION ferryman_session_event_webhooks() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO webhook_deliveries (webhook_id, session_id, type, event)
            SELECT w.id, NEW.session_id, NEW.type,
                   jsonb_build_object('seq', NEW.seq, 'type', NEW.type, 'data', NEW.data,
                                      'createdAt', NEW.created_at)
            FROM sessions s JOIN webhooks w ON w.owner_id = s.owner_id
            WHERE s.id = NEW.session_id AND NEW.type = ANY (w.events);
            RETURN NULL;
        END $$;
        CREATE TRIGGER session_events_webhooks AFTER INSERT ON session_events
            FOR EACH ROW
            WHEN (NEW.type IN ('session_end', 'tool_approval_requested', 'user_question'))
            EXECUTE FUNCTION ferryman_session_event_webhooks();

        CREATE FUNCTION ferryman_owner_event_webhooks() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO webhook_deliveries (webhook_id, session_id, type, event)
            SELECT w.id, NEW.session_id, NEW.type,
                   jsonb_build_object('type', NEW.type, 'data', NEW.data,
                                      'createdAt', NEW.created_at)
            FROM webhooks w
            WHERE w.owner_id = NEW.owner_id AND NEW.type = ANY (w.events);
            RETURN NULL;
        END $$;
        CREATE TRIGGER owner_events_webhooks AFTER INSERT ON owner_events
            FOR EACH ROW WHEN (NEW.type IN ('session_status'))
            EXECUTE FUNCTION ferryman_owner_event_webhooks();
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TRIGGER owner_events_webhooks ON owner_events;
        DROP FUNCTION ferryman_owner_event_webhooks();
        DROP TRIGGER session_events_webhooks ON session_events;
        DROP FUNCTION ferryman_session_event_webhooks();
        DROP TABLE webhook_deliveries;
        DROP TABLE webhooks;
        """
    )
