"""One frozen config dataclass per learner (light modules: standard library only)."""
