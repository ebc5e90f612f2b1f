"""Ratchet's production deployment: Dagster with the DockerRunLauncher and Postgres storage.

`python -m deploy up` brings the stack up on this machine (see docs/deploy.md)."""
