"""One frozen config dataclass per learner (stdlib imports only; defaults = validated settings)."""
