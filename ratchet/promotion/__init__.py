"""Release governance: promotion gates (gates.py), the audited state machine over the
`promotions` table (state.py, tables.py), MLflow registry aliases (registry.py) and the canary
decision (canary.py). No Dagster imports; `assets/promotion.py` wires them into the graph."""
