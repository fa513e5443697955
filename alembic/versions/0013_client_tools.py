"""Client tools: the tools a session's client declares (`clientTools`, AG-UI's `tools`),
offered to the model beside the server's and answered by the client (docs/ag-ui.md).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE sessions ADD COLUMN client_tools jsonb;")


def downgrade() -> None:
    op.execute("ALTER TABLE sessions DROP COLUMN client_tools;")
