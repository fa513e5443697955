"""Each worker's tools, kept with its `workers` row: the catalog is the tools of the workers
alive now, not what the last worker to start published. Sessions count their takeovers
(`resumes`) apart from their runs (`attempt`).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE sessions ADD COLUMN resumes integer NOT NULL DEFAULT 0;

        DROP TABLE tool_catalog;
        CREATE TABLE worker_tools (
            worker_id text NOT NULL REFERENCES workers (id) ON DELETE CASCADE,
            name text NOT NULL,
            description text NOT NULL,
            parameters jsonb NOT NULL,
            idempotent boolean NOT NULL,
            requires_approval boolean NOT NULL,
            source text NOT NULL,
            PRIMARY KEY (worker_id, name)
        );
        """
    )


def downgrade() -> None:
    op.execute(
        """
        DROP TABLE worker_tools;
        CREATE TABLE tool_catalog (
            name text PRIMARY KEY,
            description text NOT NULL,
            parameters jsonb NOT NULL,
            idempotent boolean NOT NULL,
            requires_approval boolean NOT NULL,
            source text NOT NULL,
            published_at timestamptz NOT NULL DEFAULT clock_timestamp()
        );
        ALTER TABLE sessions DROP COLUMN resumes;
        """
    )
