"""Token deltas kept for reconnects: a client that comes back mid-turn with `Last-Event-ID`
gets the chunks it missed (app/store/deltas.py). UNLOGGED: a flush writes no WAL and waits for
no fsync or standby, and the rows are best effort (a crash of the database or a failover
empties the table; each turn's `assistant_message` still carries its whole text). No foreign
key: checking one would lock the session's row at every flush (a WAL record of a logged
table); the chunks of a deleted session go with the age sweep.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE UNLOGGED TABLE session_deltas (
            session_id uuid NOT NULL,
            after_seq bigint NOT NULL,
            chunk integer NOT NULL,
            text text NOT NULL,
            created_at timestamptz NOT NULL,
            PRIMARY KEY (session_id, after_seq, chunk)
        );
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE session_deltas;")
