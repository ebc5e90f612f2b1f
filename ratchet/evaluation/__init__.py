"""Evaluation layer: holdout episodes, statistics, judge calibration, economics, the scorecard.
Dagster-free; the assets in `assets/evaluation.py` are thin wrappers over these modules."""
