"""The only package that speaks SQL about data (`db/` keeps the pool's, the migrations' and the
embedded server's own). Each function takes a connection; callers choose the transaction
(`Database.transaction()`), so one HTTP request or one run step is one commit. Statements built
from parts are registered in `statements`, whose committed copy is `statements.sql`."""
