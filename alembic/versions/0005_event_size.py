"""Each session event knows its size, so reads can stop at a byte budget.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The size of the event's JSON as served (pg_column_size would give the compressed size,
    # which says little: 100,000 emoji compress to almost nothing).
    op.execute(
        "ALTER TABLE session_events ADD COLUMN size integer"
        " GENERATED ALWAYS AS (octet_length(data::text)) STORED"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE session_events DROP COLUMN size")
