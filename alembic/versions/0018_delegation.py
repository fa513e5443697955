"""Delegation (docs/delegation.md): a session lists the assistants it may hand work to
(`delegates`, resolved at create into the tools its model is offered), and a delegate call
makes a child session that records its parent and the call, `parent {sessionId, toolCallId}`.
The pair is unique: a resumed parent can never start a second child for the same call. `depth`
counts the delegations above a session (FERRYMAN_MAX_AGENT_DEPTH). Assistants store their
`delegates` and, for the scripted model, a `script`, which their children run with.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE sessions ADD COLUMN delegates jsonb, ADD COLUMN parent_session_id uuid,
            ADD COLUMN parent_tool_call_id text, ADD COLUMN depth integer NOT NULL DEFAULT 0;
        CREATE UNIQUE INDEX sessions_parent_call
            ON sessions (parent_session_id, parent_tool_call_id)
            WHERE parent_session_id IS NOT NULL;
        ALTER TABLE assistant_versions ADD COLUMN delegates jsonb, ADD COLUMN script jsonb;
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE assistant_versions DROP COLUMN delegates, DROP COLUMN script;
        DROP INDEX sessions_parent_call;
        ALTER TABLE sessions DROP COLUMN delegates, DROP COLUMN parent_session_id,
            DROP COLUMN parent_tool_call_id, DROP COLUMN depth;
        """
    )
