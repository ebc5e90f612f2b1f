"""Governance domain core: dedup (MinHash + AST), clusters, group-aware splits, the locked
holdout manifest, the contamination gate and consent. Plain functions over plain data; no
Dagster imports (the assets in `assets/` wrap these)."""
