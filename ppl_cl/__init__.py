"""ppl_cl — Bayesian continual, lifelong and online learning as probabilistic programs.

The user layer: one learner class per method (all on the protocol of :mod:`ppl_cl.learner`),
data and streams (:mod:`ppl_cl.data`), metrics, ArviZ export, experiments and the ``ppl-cl``
command. Generative models live in the top-level package ``models`` and inference engines in
``inference``. Importing ``ppl_cl`` loads neither torch nor JAX.
"""

from ppl_cl.batch import Batch, Task
from ppl_cl.learner import Learner
from ppl_cl.predictive import CategoricalPredictive, GaussianPredictive

__version__ = "0.1.0"
__all__ = ["Batch", "Task", "Learner", "GaussianPredictive", "CategoricalPredictive",
           "__version__"]
