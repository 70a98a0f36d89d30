"""The decision store: engines and sessions (db), tables (models), queries (repo), schema
migrations (migrate). Plain library code, shared by the API, the CLI and the workers."""
