"""Execution environments: task bundles, the hermetic runtime, tools, verifiers, rewards and
task suites. Imports nothing from Dagster so rollout workers (VeRL/Ray, user trainers) can use it."""
