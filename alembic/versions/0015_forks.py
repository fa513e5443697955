"""Forks: a session made from a prefix of another's log (`POST /api/agent/{id}/fork`) records
where it came from, `forkedFrom {sessionId, seq}` (docs/fork.md). No foreign key: the parent
may be deleted and purged by retention while its forks live on.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE sessions ADD COLUMN forked_from_session_id uuid,"
        " ADD COLUMN forked_from_seq bigint;"
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE sessions DROP COLUMN forked_from_session_id, DROP COLUMN forked_from_seq;"
    )
