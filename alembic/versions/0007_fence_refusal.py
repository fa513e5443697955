"""A refused fence is an error, so it aborts the transaction it happens in; the rows updated
many times a second leave room on their pages for their next versions.

A run's writes are pipelined (sent without waiting for each answer): a fenced statement that
merely wrote nothing would let the statements queued after it commit. Raised instead, it rolls
the whole transaction back, as the runner's check of each row did before.

An owner's cursor row is updated at every owner event, a session row at every event of its log.
Each update adds a version of the row to its page (a HOT update), and a page is pruned of the
dead ones only once it is nearly full: an owner cursor's page held ~100 versions of one row, and
every lookup walked them (a quarter of the server's CPU in `bench.compare`). A low fillfactor
prunes the page at almost every update.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE owner_cursors SET (fillfactor = 10)")
    op.execute("ALTER TABLE sessions SET (fillfactor = 50)")
    # SQLSTATE LEASE is ours (app.store.events.FENCE_REFUSED); the return type lets it stand
    # in a WHERE clause.
    op.execute(
        """
        CREATE FUNCTION ferryman_fence_refused(session uuid) RETURNS boolean
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'fence refused: the lease on session % is no longer held', session
                USING ERRCODE = 'LEASE';
        END $$
        """
    )


def downgrade() -> None:
    op.execute("ALTER TABLE owner_cursors RESET (fillfactor)")
    op.execute("ALTER TABLE sessions RESET (fillfactor)")
    op.execute("DROP FUNCTION ferryman_fence_refused(uuid)")
