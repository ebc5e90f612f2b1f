"""Ratchet's domain core: trajectory contract and adapters, ingest, dedup/splits, consent,
evaluation statistics, economics, promotion gates, training loops. Imports nothing from Dagster."""
__version__ = "0.1.0"
