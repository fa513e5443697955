"""Key policy: what a key may do beyond its owner's defaults (`api_keys.policy`): its limits
and priority, the tools and models it may use, the owners it approves for (docs/tenants.md).
`{}` is a key with the defaults.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE api_keys ADD COLUMN policy jsonb NOT NULL DEFAULT '{}'")


def downgrade() -> None:
    op.execute("ALTER TABLE api_keys DROP COLUMN policy")
