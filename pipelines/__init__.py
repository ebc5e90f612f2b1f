"""Dagster Definitions, jobs, schedules, sensors and the `ratchet` CLI."""
