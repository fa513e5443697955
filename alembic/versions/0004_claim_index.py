"""The claim's index covers every claimable session, deleted ones included.

A deleted session can still be running (its holder was frozen when the delete gave up waiting)
and must be claimable, to be settled `cancelled`; the old index left those out, so the claim's
`running` branch could not imply its predicate and PostgreSQL scanned every session.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        DROP INDEX sessions_claimable;
        CREATE INDEX sessions_claimable ON sessions (created_at)
            WHERE status IN ('queued', 'running');
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP INDEX sessions_claimable;
        CREATE INDEX sessions_claimable ON sessions (created_at)
            WHERE status IN ('queued', 'running') AND deleted_at IS NULL;
        """
    )
