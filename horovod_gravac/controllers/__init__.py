"""Controllers: who decides each step's compression factor (see ``base.py`` for the
interface and how the optimizer drives one).

* ``base``: :class:`Controller`, :class:`Decision`, :class:`StepObservation`, :class:`Dense`,
  :class:`StaticCF`;
* ``gravac``: :class:`GraVAC`, the part its rule sets share; ``GraVAC(variant=...)`` builds one
  of ``paper`` (:class:`PaperGraVAC`, Algorithm 1 as published), ``ladder``
  (:class:`LadderGraVAC`, the default) or ``delivered`` (:class:`DeliveredGraVAC`);
* ``accordion``: :class:`Accordion`.
"""
from .accordion import Accordion
from .base import DENSE, HISTORY_MAXLEN, Controller, Decision, Dense, StaticCF, StepObservation
from .delivered import DeliveredGraVAC, window_gain
from .gravac import DEFAULT_EPSILON, DEFAULT_VARIANT, VARIANTS, GraVAC
from .ladder import LadderGraVAC
from .paper import PaperGraVAC
from .predictive import PredictiveGraVAC

__all__ = ["Controller", "Decision", "StepObservation", "Dense", "StaticCF", "GraVAC", "PaperGraVAC",
           "LadderGraVAC", "DeliveredGraVAC", "PredictiveGraVAC", "Accordion", "DENSE", "HISTORY_MAXLEN", "VARIANTS",
           "DEFAULT_VARIANT", "DEFAULT_EPSILON", "window_gain"]
