"""The key that created a session (`sessions.created_by_key_id`; NULL: no key, as in local
and jwt modes, or made by a schedule): a delegated child inherits it and its scopes, and with
FERRYMAN_APPROVAL_SEPARATE it may not decide the session's approvals (docs/approvals.md).
No foreign key: keys are revoked, never deleted, and a session outlives its key's use.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE sessions ADD COLUMN created_by_key_id uuid")


def downgrade() -> None:
    op.execute("ALTER TABLE sessions DROP COLUMN created_by_key_id")
