"""Provider budgets shared by every worker (docs/budgets.md): one row per budget key with its
request and token buckets and its pause, and the budget's concurrency slots, each held until
`expires_at` (renewed by its worker's heartbeat, so a killed worker's slot frees itself).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE provider_budgets (
            key text PRIMARY KEY,
            requests float8 NOT NULL DEFAULT 'Infinity',
            tokens float8 NOT NULL DEFAULT 'Infinity',
            refilled_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            paused_until timestamptz
        );
        CREATE TABLE provider_slots (
            key text NOT NULL REFERENCES provider_budgets (key) ON DELETE CASCADE,
            n int NOT NULL,
            holder uuid,
            worker_id text,
            expires_at timestamptz NOT NULL DEFAULT '-infinity',
            PRIMARY KEY (key, n)
        );
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE provider_slots; DROP TABLE provider_budgets;")
