"""Agent definition, usage totals, and the tool catalog workers publish.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE sessions
            ADD COLUMN instructions text,
            ADD COLUMN model_settings jsonb NOT NULL DEFAULT '{}'::jsonb,
            ADD COLUMN approval_required jsonb,
            ADD COLUMN input_tokens bigint NOT NULL DEFAULT 0,
            ADD COLUMN output_tokens bigint NOT NULL DEFAULT 0,
            ADD COLUMN cached_tokens bigint NOT NULL DEFAULT 0;

        -- The tools workers offer (built-ins, plug-ins, MCP servers), as the last worker to
        -- start or to reconnect an MCP server saw them: what GET /api/tools lists.
        CREATE TABLE tool_catalog (
            name text PRIMARY KEY,
            description text NOT NULL,
            parameters jsonb NOT NULL,
            idempotent boolean NOT NULL,
            requires_approval boolean NOT NULL,
            source text NOT NULL,
            published_at timestamptz NOT NULL DEFAULT clock_timestamp()
        );
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE tool_catalog;
        ALTER TABLE sessions
            DROP COLUMN instructions, DROP COLUMN model_settings, DROP COLUMN approval_required,
            DROP COLUMN input_tokens, DROP COLUMN output_tokens, DROP COLUMN cached_tokens;
        """
    )
