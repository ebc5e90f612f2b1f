"""The lifecycle graph: one module per stage; asset bodies are thin wrappers over ratchet/."""
