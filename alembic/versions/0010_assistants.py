"""Sessions may be `idle` (created without a prompt, no run until their first message), and
assistants: an owner's stored agent definitions, each edit an immutable new version, which a
session created from one copies and pins (`assistant_id`, `assistant_version`).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE sessions DROP CONSTRAINT sessions_status_check;
        ALTER TABLE sessions ADD CONSTRAINT sessions_status_check CHECK (status IN
            ('idle', 'queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled'));

        CREATE TABLE assistants (
            id uuid PRIMARY KEY,
            owner_id text NOT NULL,
            version integer NOT NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            deleted_at timestamptz
        );
        CREATE INDEX assistants_owner_listing ON assistants (owner_id, created_at DESC, id DESC)
            WHERE deleted_at IS NULL;

        -- Never updated: a version is what sessions created from it copied.
        CREATE TABLE assistant_versions (
            assistant_id uuid NOT NULL REFERENCES assistants (id) ON DELETE CASCADE,
            version integer NOT NULL,
            name text NOT NULL,
            description text,
            model text NOT NULL,
            instructions text,
            model_settings jsonb NOT NULL DEFAULT '{}'::jsonb,
            tools jsonb,
            approval_required jsonb,
            metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (assistant_id, version)
        );

        ALTER TABLE sessions
            ADD COLUMN assistant_id uuid,
            ADD COLUMN assistant_version integer;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE sessions DROP COLUMN assistant_id, DROP COLUMN assistant_version;
        DROP TABLE assistant_versions;
        DROP TABLE assistants;
        UPDATE sessions SET status = 'cancelled' WHERE status = 'idle';
        ALTER TABLE sessions DROP CONSTRAINT sessions_status_check;
        ALTER TABLE sessions ADD CONSTRAINT sessions_status_check CHECK (status IN
            ('queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled'));
        """
    )
