"""Priority and per-owner limits (SPEC section 13, docs/tenants.md).

- `sessions.priority` (-100..100, 0 by default): claims take higher priorities first. Each
  owner keeps one queue clock per priority (`owner_queues` is keyed by owner and priority), so
  within a priority the claims stay fair across owners as before (docs/fairness.md), and an
  owner's backlog at one priority does not push back its sessions at another.
- The claim index is `(priority DESC, claim_key)`: the claim still reads it in order.
- `sessions_owner_active`: an owner's queued and running sessions, for the per-owner limits
  (FERRYMAN_OWNER_MAX_RUNNING, FERRYMAN_OWNER_MAX_QUEUED), counted only when they are set.
- `rate_windows`: the per-minute counts of the rate limits per key, shared by every API
  process. Unlogged: a count lost in a crash only lets a minute's requests through again.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-03
"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE sessions ADD COLUMN priority smallint NOT NULL DEFAULT 0
            CONSTRAINT sessions_priority_range CHECK (priority BETWEEN -100 AND 100);

        ALTER TABLE owner_queues ADD COLUMN priority smallint NOT NULL DEFAULT 0;
        ALTER TABLE owner_queues DROP CONSTRAINT owner_queues_pkey;
        ALTER TABLE owner_queues ADD PRIMARY KEY (owner_id, priority);

        CREATE OR REPLACE FUNCTION ferryman_claim_key() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO owner_queues AS q (owner_id, priority, clock)
            VALUES (NEW.owner_id, NEW.priority, clock_timestamp())
            ON CONFLICT (owner_id, priority) DO UPDATE
                SET clock = greatest(q.clock + interval '1 second', clock_timestamp())
            RETURNING q.clock INTO NEW.claim_key;
            RETURN NEW;
        END $$;

        DROP INDEX sessions_claimable;
        CREATE INDEX sessions_claimable ON sessions (priority DESC, claim_key)
            WHERE status IN ('queued', 'running');
        CREATE INDEX sessions_owner_active ON sessions (owner_id, status)
            WHERE status IN ('queued', 'running');

        CREATE UNLOGGED TABLE rate_windows (
            subject text NOT NULL,
            action text NOT NULL,
            window_start timestamptz NOT NULL,
            count integer NOT NULL,
            PRIMARY KEY (subject, action)
        );
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE rate_windows;
        DROP INDEX sessions_owner_active;
        DROP INDEX sessions_claimable;
        CREATE INDEX sessions_claimable ON sessions (claim_key)
            WHERE status IN ('queued', 'running');
        CREATE OR REPLACE FUNCTION ferryman_claim_key() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO owner_queues AS q (owner_id, clock)
            VALUES (NEW.owner_id, clock_timestamp())
            ON CONFLICT (owner_id) DO UPDATE
                SET clock = greatest(q.clock + interval '1 second', clock_timestamp())
            RETURNING q.clock INTO NEW.claim_key;
            RETURN NEW;
        END $$;
        DELETE FROM owner_queues q WHERE priority <> 0;
        ALTER TABLE owner_queues DROP CONSTRAINT owner_queues_pkey;
        ALTER TABLE owner_queues ADD PRIMARY KEY (owner_id);
        ALTER TABLE owner_queues DROP COLUMN priority;
        ALTER TABLE sessions DROP COLUMN priority;
        """
    )
