"""SIDCo's distribution fits: the excess above which a density of a fitted law lies.

SIDCo (Abdelmoniem et al., MLSys 2021) models gradient magnitudes with a
sparsity-inducing distribution and reads the threshold for density ``delta`` off
the fitted tail, with no sort:

* ``exponential``: ``eta = -mu * ln(delta)``, ``mu`` the mean magnitude;
* ``gpareto`` (generalised Pareto, moment estimators): with ``r = mean^2 / var``,
  ``xi = (1 - r) / 2`` and ``sigma = mean (1 + r) / 2``;
  ``eta = sigma / xi * (delta^-xi - 1)`` (``-sigma ln delta`` as ``xi -> 0``);
* ``gamma`` (moment estimators ``alpha = mean^2 / var``, ``beta = var / mean``):
  ``eta = beta * Q^-1(alpha, delta)``, the inverse of the regularised upper
  incomplete gamma function, by a few Newton steps from the best of three
  closed-form starting points (``torch.special.gammaincc``; no SciPy).

Each fit has a torch version (0-dim device tensors, no host synchronisation) and a host
version (Python floats) for the CPU host path; the stages that use them are in
``sidco.py``.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import torch

from .. import native

DISTRIBUTIONS = ("exponential", "gpareto", "gamma")
_NEWTON_STEPS = 8
_STANDARD_NORMAL = NormalDist()


def gamma_upper_quantile(alpha: torch.Tensor, density: torch.Tensor) -> torch.Tensor:
    """``y`` with ``Q(alpha, y) = density`` (standard gamma upper tail), float64, no host sync.

    Newton steps on ``ln Q`` in ``u = ln y`` from the best of three starting points:
    the small-``y`` expansion ``Q ~ 1 - y^alpha / Gamma(alpha + 1)``, the large-``y``
    asymptote ``Q ~ y^(alpha-1) e^-y / Gamma(alpha)`` and the Wilson-Hilferty normal
    approximation (large ``alpha``).
    """
    alpha = alpha.double()
    density = density.double().clamp(1e-300, 1.0 - 1e-12)
    log_d = torch.log(density)
    lg = torch.lgamma(alpha)

    def g(u):
        return torch.log(torch.special.gammaincc(alpha, torch.exp(u)).clamp(min=1e-300)) - log_d

    u_small = (torch.lgamma(alpha + 1.0) + torch.log1p(-density)) / alpha
    big = -log_d
    u_large = torch.log(torch.maximum(
        (big - lg + (alpha - 1.0) * torch.log(torch.maximum(big, alpha))).clamp(min=1e-3), alpha))
    z = torch.special.ndtri(1.0 - density)
    c = 1.0 / (9.0 * alpha)
    u_wh = 3.0 * torch.log((1.0 - c + z * torch.sqrt(c)).clamp(min=1e-3)) + torch.log(alpha)
    starts = torch.stack([u_small, u_large, u_wh])
    best = torch.argmin(torch.stack([g(u_small), g(u_large), g(u_wh)]).abs())
    u = starts.index_select(0, best.view(1)).squeeze(0)     # no host sync (unlike starts[best])
    for _ in range(_NEWTON_STEPS):
        y = torch.exp(u)
        q = torch.special.gammaincc(alpha, y).clamp(min=1e-300)
        slope = -torch.exp((alpha - 1.0) * u - y - lg + u - torch.log(q))   # d ln Q / d u
        u = u - ((torch.log(q) - log_d) / slope.clamp(max=-1e-300)).clamp(-5.0, 5.0)
    return torch.exp(u)


def fitted_excess(distribution: str, moments: torch.Tensor, density: torch.Tensor) -> torch.Tensor:
    """Excess above which a fraction ``density`` of the fitted distribution lies.

    ``moments = [m, sum w, sum w^2]`` of the excesses ``w`` (float64 device tensor).
    """
    m = moments[0].clamp(min=1.0)
    mean = moments[1] / m
    var = (moments[2] / m - mean * mean).clamp(min=1e-12 * mean * mean + 1e-300)
    density = density.clamp(1e-300, 1.0)
    log_d = torch.log(density)
    if distribution == "exponential":
        return -mean * log_d
    ratio = (mean * mean / var).clamp(1e-4, 1e4)
    if distribution == "gpareto":
        xi = 0.5 * (1.0 - ratio)
        sigma = 0.5 * mean * (1.0 + ratio)
        safe = torch.where(xi.abs() < 1e-8, torch.ones_like(xi), xi)
        return torch.where(xi.abs() < 1e-8, -sigma * log_d, sigma * torch.expm1(-safe * log_d) / safe)
    # gamma (density 1: every excess, threshold 0; the quantile's Newton steps do not reach 0)
    alpha = ratio.clamp(0.01, 1e4)
    beta = var / mean.clamp(min=1e-300)
    return torch.where(density >= 1.0, torch.zeros_like(beta), beta * gamma_upper_quantile(alpha, density))


# -- host (CPU) versions: Python floats instead of 0-dim tensors --------------------------------
def _gammaincc_host(a: float, x: float) -> float:
    """Regularised upper incomplete gamma ``Q(a, x)`` (series below ``a + 1``, continued fraction above)."""
    if x <= 0.0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:
        ap, term = a, 1.0 / a
        total = term
        for _ in range(100000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    b = x + 1.0 - a
    c, d = 1e300, 1.0 / b
    h = d
    for i in range(1, 100000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = d if abs(d) > 1e-300 else 1e-300
        c = b + an / c
        c = c if abs(c) > 1e-300 else 1e-300
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(log_front) * h


def gamma_upper_quantile_host(alpha: float, density: float) -> float:
    """:func:`gamma_upper_quantile` with Python floats: the same starting points and Newton steps.

    With the native kernels the loops run in C (``native.gamma_upper_quantile``, the same double:
    ``tests/unit/test_host_path.py`` compares them): here each of its ~7 evaluations of ``Q`` is a
    Python loop, 10-40 us a call, which made SIDCo gamma 2.0x exact Top-k at 262K entries and
    CF 1000."""
    density = min(max(density, 1e-300), 1.0 - 1e-12)
    lg = math.lgamma(alpha)
    if native.available():
        return native.gamma_upper_quantile(alpha, density, lg, math.lgamma(alpha + 1.0),
                                           -_STANDARD_NORMAL.inv_cdf(density), _NEWTON_STEPS)
    return _gamma_upper_quantile_python(alpha, density, lg)


def _gamma_upper_quantile_python(alpha: float, density: float, lg: float) -> float:
    log_d = math.log(density)

    def g(u):
        return math.log(max(_gammaincc_host(alpha, math.exp(u)), 1e-300)) - log_d

    u_small = (math.lgamma(alpha + 1.0) + math.log1p(-density)) / alpha
    big = -log_d
    u_large = math.log(max(max(big - lg + (alpha - 1.0) * math.log(max(big, alpha)), 1e-3), alpha))
    z = -_STANDARD_NORMAL.inv_cdf(density)
    c = 1.0 / (9.0 * alpha)
    u_wh = 3.0 * math.log(max(1.0 - c + z * math.sqrt(c), 1e-3)) + math.log(alpha)
    u = min((u_small, u_large, u_wh), key=lambda v: abs(g(v)))
    for _ in range(_NEWTON_STEPS):
        y = math.exp(u)
        q = max(_gammaincc_host(alpha, y), 1e-300)
        slope = -math.exp(min((alpha - 1.0) * u - y - lg + u - math.log(q), 700.0))
        step = min(max((math.log(q) - log_d) / min(slope, -1e-300), -5.0), 5.0)
        u = u - step
        if abs(step) <= 1e-14 * max(1.0, abs(u)):
            break   # converged: later steps move u by less than its rounding (each costs a Q in Python)
    return math.exp(u)


def fitted_excess_host(distribution: str, moments, density: float) -> float:
    """:func:`fitted_excess` with Python floats (``moments = (m, sum w, sum w^2)``)."""
    m = max(moments[0], 1.0)
    mean = moments[1] / m
    var = max(moments[2] / m - mean * mean, 1e-12 * mean * mean + 1e-300)
    density = min(max(density, 1e-300), 1.0)
    log_d = math.log(density)
    if distribution == "exponential":
        return -mean * log_d
    ratio = min(max(mean * mean / var, 1e-4), 1e4)
    if distribution == "gpareto":
        xi = 0.5 * (1.0 - ratio)
        sigma = 0.5 * mean * (1.0 + ratio)
        if abs(xi) < 1e-8:
            return -sigma * log_d
        return sigma * math.expm1(-xi * log_d) / xi
    alpha = min(max(ratio, 0.01), 1e4)
    beta = var / max(mean, 1e-300)
    if density >= 1.0:   # every excess (the quantile's Newton steps do not reach 0)
        return 0.0
    return beta * gamma_upper_quantile_host(alpha, density)


def excess_moments(values: torch.Tensor, base: torch.Tensor, squares: bool = True) -> torch.Tensor:
    """``[m, sum w, sum w^2]`` of ``w = v - base`` over ``v > base`` (no host sync)."""
    w = (values - base.to(values.dtype)).clamp_(min=0)
    sq = torch.dot(w, w).double() if squares else torch.zeros((), dtype=torch.float64, device=w.device)
    total = w.sum().double()
    return torch.stack([w.sign_().sum().double(), total, sq])

