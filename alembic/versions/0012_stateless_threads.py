"""The stateless Agent Protocol threads left to delete, indexed: the retention pass looks for
those whose run ended (app/store/threads.py `ended_stateless_threads`) without reading every
session.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE INDEX sessions_stateless_to_delete ON sessions (updated_at)
        WHERE deleted_at IS NULL
          AND metadata @> '{"stateless": true, "on_completion": "delete"}'::jsonb;
        """
    )


def downgrade() -> None:
    op.execute("DROP INDEX sessions_stateless_to_delete;")
