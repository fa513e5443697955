"""Owner events know their size too, so an owner stream's reads stop at a byte budget.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # As for session events (0005): the size as served, not as stored (compressed).
    op.execute(
        "ALTER TABLE owner_events ADD COLUMN size integer"
        " GENERATED ALWAYS AS (octet_length(data::text)) STORED"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE owner_events DROP COLUMN size")
