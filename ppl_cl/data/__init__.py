"""Datasets (synthetic generators and real-file loaders), data roots, and streams."""

from ppl_cl.data.root import DATASETS, MissingDataError, data_roots, locate, set_data_dir

__all__ = ["DATASETS", "MissingDataError", "data_roots", "locate", "set_data_dir"]
