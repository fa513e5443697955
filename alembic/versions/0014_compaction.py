"""Compaction: a session's and an assistant version's `compaction` settings
(docs/compaction.md); the summaries themselves are events of the log.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE sessions ADD COLUMN compaction jsonb;")
    op.execute("ALTER TABLE assistant_versions ADD COLUMN compaction jsonb;")


def downgrade() -> None:
    op.execute("ALTER TABLE assistant_versions DROP COLUMN compaction;")
    op.execute("ALTER TABLE sessions DROP COLUMN compaction;")
