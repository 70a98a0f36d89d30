"""The decision store: engines and sessions (db), tables (models), schema migrations and
readiness (migrate), and queries by resource: decisions and their single-flight claim
(decisions), trials and group records (searches), modules and hardware rows (catalog).
Plain library code, shared by the API, the CLI and the workers."""
