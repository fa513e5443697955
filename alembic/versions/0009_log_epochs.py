"""Each event row records the epoch of the log it was written in: the server's WAL timeline
counted from the one this migration ran on. A standby promoted after asynchronous replication
starts a new timeline without the primary's last commits; the seqs and owner ids of those lost
events are given out again, to other events. A client's cursor carries the epoch of the event it
names (`app/streams/frames.py` `position`), so a reconnect can tell an event it saw from another
one of the same number and answer `resync_required` instead of a silent gap.

The column default reads the timeline of the WAL being written (`pg_walfile_name` of
`pg_current_wal_lsn`): right from a promotion's first commit, and per row, so it holds through a
transaction-mode pooler. Where the server does not offer those functions the epoch is always 0
and a rewind goes unseen, as before (docs/deploy.md).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from alembic import op
from sqlalchemy.exc import DBAPIError

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_TIMELINE = "('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::int"


def upgrade() -> None:
    bind = op.get_bind()
    try:
        with bind.begin_nested():
            base = bind.exec_driver_sql(f"SELECT {_TIMELINE}").scalar_one()
        epoch = f"greatest(0, {_TIMELINE} - {int(base)})"
    except DBAPIError:
        epoch = "0"  # no WAL functions on this server: epochs stay 0
    # The base timeline is a constant of the function's body: no lookup per row.
    op.execute(
        "CREATE FUNCTION ferryman_log_epoch() RETURNS smallint LANGUAGE sql VOLATILE"
        f" AS $$ SELECT ({epoch})::smallint $$"
    )
    # Constant defaults first (no table rewrite: old rows are epoch 0), then the live one.
    op.execute(
        """
        ALTER TABLE session_events ADD COLUMN epoch smallint NOT NULL DEFAULT 0;
        ALTER TABLE session_events ALTER COLUMN epoch SET DEFAULT ferryman_log_epoch();
        ALTER TABLE owner_events ADD COLUMN epoch smallint NOT NULL DEFAULT 0;
        ALTER TABLE owner_events ALTER COLUMN epoch SET DEFAULT ferryman_log_epoch();
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE session_events DROP COLUMN epoch;
        ALTER TABLE owner_events DROP COLUMN epoch;
        DROP FUNCTION ferryman_log_epoch();
        """
    )
