"""One frozen config dataclass per learner (``ppl_cl.configs.<method>``); stdlib imports only."""
