"""HTTP: routers, request/response schemas, problem+json errors, auth."""
