"""Fair claims across owners: each session that becomes queued gets a claim key from its owner's
queue clock, which moves FAIR_SHARE further on with every session the owner queues, and never
lags the database clock. The claim takes the smallest keys first, so a backlog one owner queued
puts its own later sessions behind each other, not another owner's first session, which is
keyed at about "now" (docs/fairness.md). Within an owner the order stays first queued, first
claimed. A running session (a lease to take over) keeps the key it was queued with: it goes
first.

The key is set by triggers, so that every way a session becomes queued (a create, a message,
a thread's run, a re-queue) takes its turn the same way, in the statement that queues it.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE owner_queues (
            owner_id text PRIMARY KEY,
            clock timestamptz NOT NULL
        );
        ALTER TABLE sessions ADD COLUMN claim_key timestamptz;
        UPDATE sessions SET claim_key = created_at WHERE status IN ('queued', 'running');
        ALTER TABLE sessions ALTER COLUMN claim_key SET DEFAULT clock_timestamp();

        CREATE FUNCTION ferryman_claim_key() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO owner_queues AS q (owner_id, clock)
            VALUES (NEW.owner_id, clock_timestamp())
            ON CONFLICT (owner_id) DO UPDATE
                SET clock = greatest(q.clock + interval '1 second', clock_timestamp())
            RETURNING q.clock INTO NEW.claim_key;
            RETURN NEW;
        END $$;
        CREATE TRIGGER sessions_queued_insert BEFORE INSERT ON sessions
            FOR EACH ROW WHEN (NEW.status = 'queued') EXECUTE FUNCTION ferryman_claim_key();
        CREATE TRIGGER sessions_queued_update BEFORE UPDATE OF status ON sessions
            FOR EACH ROW WHEN (NEW.status = 'queued' AND OLD.status <> 'queued')
            EXECUTE FUNCTION ferryman_claim_key();

        DROP INDEX sessions_claimable;
        CREATE INDEX sessions_claimable ON sessions (claim_key)
            WHERE status IN ('queued', 'running');
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX sessions_claimable;
        CREATE INDEX sessions_claimable ON sessions (created_at)
            WHERE status IN ('queued', 'running');
        DROP TRIGGER sessions_queued_update ON sessions;
        DROP TRIGGER sessions_queued_insert ON sessions;
        DROP FUNCTION ferryman_claim_key();
        ALTER TABLE sessions DROP COLUMN claim_key;
        DROP TABLE owner_queues;
        """
    )
