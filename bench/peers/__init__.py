"""The systems `bench.compare` runs side by side, one module each.

Every module is a small command with two subcommands, run in child processes by
`bench.compare`:

- `setup --url URL --units N`: install the system's schema in an empty database and enqueue N
  units of work (nothing runs them yet);
- `worker --url URL --index I --concurrency C --ready FILE`: import everything and build the
  worker, create FILE, wait for one line on stdin ("go"), then run the worker until SIGTERM.

The gate keeps interpreter start-up and imports out of the measured window: the clock and the
CPU counters start when `bench.compare` sends "go" to every worker at once.

Each module also names, for `bench.compare`, the SQL that counts finished units (`DONE_SQL`)
and the time the last one finished, in epoch seconds, from the database's own timestamps
(`FINISHED_SQL`).
"""
