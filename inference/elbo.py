"""A mean-field ELBO that computes only the terms it uses.

:class:`LazyTraceMeanField_ELBO` returns the same loss and gradients as Pyro's
``TraceMeanField_ELBO`` (the reference it is tested against) with less work per step:

* Pyro's ``get_importance_trace`` computes the log-density of *every* model site and the score
  parts of *every* guide site before the loss looks at them; for a latent site with an analytic
  KL those are never used. Here a log-density is computed only where the loss needs it:
  observed sites (the likelihood, ``pyro.factor``), latent sites without an analytic KL (the
  sampled fallback ``log p - log q``) and auxiliary guide sites;
* a latent site whose model distribution is the guide's contributes ``KL[q || q] = 0`` with
  zero gradient, so nothing is computed for it. The program says so with
  ``pyro.sample(name, fn, infer={"shared_factor": True})`` in the guide (Pyro's ``replay``
  hands the guide's ``infer`` dict to the model's site) and, for the reader, in the model. (An
  identity test of the two distribution objects cannot do this: Pyro's plates replace each
  site's distribution by an expanded copy.)
  VAR-GP's model repeats the guide's factors ``q(u_j | u_<j, theta)`` of earlier tasks (the
  ``q(u_<t | theta)`` of eqs. 6-7 in Kapoor et al. 2021, identical in model and guide); without
  this their cost would grow with the number of tasks for terms that are exactly zero.

Whenever Pyro's validation is enabled (``pyro.validation_enabled()``; :class:`inference.svi.SVI`
enables it on the first step of a fit) the reference path of ``TraceMeanField_ELBO`` runs
unchanged, with all of Pyro's model/guide checks, and every ``shared_factor`` site is checked:
a model distribution that differs from the guide's raises ``ValueError``. Guides written as
``GuideMessenger`` also take the reference path.
"""

from __future__ import annotations

import torch
from pyro import poutine
from pyro.distributions.util import scale_and_mask
from pyro.infer import TraceMeanField_ELBO
from pyro.infer.util import is_validation_enabled, torch_item
from pyro.poutine.util import prune_subsample_sites
from torch.distributions import kl_divergence

__all__ = ["LazyTraceMeanField_ELBO"]


def _scaled_log_prob_sum(site) -> torch.Tensor:
    """``sum(scale * mask * log p(value))`` of one site, as Pyro's ``Trace.compute_log_prob``."""
    log_p = site["fn"].log_prob(site["value"], *site["args"], **site["kwargs"])
    return scale_and_mask(log_p, site["scale"], site["mask"]).sum()


def _shared(model_site, guide_site) -> bool:
    return bool(model_site["infer"].get("shared_factor")
                or guide_site["infer"].get("shared_factor"))


def _check_shared_factors(model_trace, guide_trace, rtol: float = 1e-5) -> None:
    """Raise ``ValueError`` for a site flagged ``shared_factor`` whose model density differs
    from the guide's at the guide's sample (relative tolerance ``rtol``)."""
    for name, model_site in model_trace.nodes.items():
        if model_site["type"] != "sample" or model_site["is_observed"]:
            continue
        guide_site = guide_trace.nodes.get(name)
        if guide_site is None or not _shared(model_site, guide_site):
            continue
        with torch.no_grad():
            value = guide_site["value"]
            log_q = guide_site["fn"].log_prob(value)
            log_p = model_site["fn"].log_prob(value)
            gap = float((log_p - log_q).abs().max())
            size = float(log_q.abs().max()) + 1.0
        if not gap <= rtol * size:
            raise ValueError(f"site {name!r} is flagged shared_factor but its model distribution "
                             f"differs from the guide's (max |log p - log q| = {gap:.3g} at the "
                             f"guide's sample); remove the flag or pass the guide's factor")


class LazyTraceMeanField_ELBO(TraceMeanField_ELBO):
    """``TraceMeanField_ELBO`` computing only the densities its estimate uses (module doc).

    Same constructor arguments and the same requirements (a mean-field, fully reparameterized
    guide) as Pyro's class."""

    def _get_trace(self, model, guide, args, kwargs):
        if is_validation_enabled() or isinstance(poutine.unwrap(guide), poutine.messenger.Messenger):
            return super()._get_trace(model, guide, args, kwargs)
        guide_trace = poutine.trace(guide, graph_type="flat").get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace),
                                    graph_type="flat").get_trace(*args, **kwargs)
        return prune_subsample_sites(model_trace), prune_subsample_sites(guide_trace)

    def _differentiable_loss_particle(self, model_trace, guide_trace):
        if is_validation_enabled() or any(
                site["type"] == "sample" and "log_prob_sum" in site
                for site in model_trace.nodes.values()):
            # reference path (its traces already carry every log-density)
            if is_validation_enabled():
                _check_shared_factors(model_trace, guide_trace)
            return super()._differentiable_loss_particle(model_trace, guide_trace)
        elbo = 0.0
        for name, model_site in model_trace.nodes.items():
            if model_site["type"] != "sample":
                continue
            if model_site["is_observed"]:
                elbo = elbo + _scaled_log_prob_sum(model_site)
                continue
            guide_site = guide_trace.nodes[name]
            if _shared(model_site, guide_site):
                continue  # KL[q || q] = 0, and so is its gradient
            try:
                kl = kl_divergence(guide_site["fn"], model_site["fn"])
            except NotImplementedError:
                elbo = elbo + _scaled_log_prob_sum(model_site) - _scaled_log_prob_sum(guide_site)
                continue
            kl = scale_and_mask(kl, scale=guide_site["scale"], mask=guide_site["mask"])
            if torch.is_tensor(kl):
                elbo = elbo - kl.sum()
            else:
                elbo = elbo - kl * torch.Size(guide_site["fn"].batch_shape).numel()
        for name, guide_site in guide_trace.nodes.items():
            if guide_site["type"] == "sample" and name not in model_trace.nodes:
                elbo = elbo - _scaled_log_prob_sum(guide_site)   # auxiliary guide site
        loss = -torch_item(elbo)
        return loss, -elbo
