"""Policy engines behind ratchet.policy.base.Policy (imported lazily by make_policy)."""
