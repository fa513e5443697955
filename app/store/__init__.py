"""The only package that speaks SQL. Each function takes a connection; callers choose the
transaction (`Database.transaction()`), so one HTTP request or one run step is one commit."""
