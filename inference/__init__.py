"""HOW: inference engines, generic over the models they drive. Imports only ``models``."""
