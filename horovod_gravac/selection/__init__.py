"""Which entries a sparsifier keeps: the selection logic of the compressors, without Horovod.

Everything here is torch, NumPy and the native kernels (``horovod_gravac.native``); nothing
imports Horovod.  Each selector holds its parameters and ``select``/``select_payload``;
:mod:`horovod_gravac.compressors` turns each into a Horovod ``Compressor`` with a class of
no code of its own (``class TopKCompressor(SparseCompressor)``, ``selector_class = TopKSelector``).

* ``payload``: :class:`SparsePayload`, :class:`SparseContext` (what a sparsifier sends);
* ``base``: :class:`Selector` (``cf``, ``select``) and parameter checks;
* ``sampling``: stratified samples and draws, private per-device generators;
* ``kernels``: the threshold kernels (exceedance moments, ``|x| >= t`` selection);
* ``topk``: exact Top-k from a sampled threshold (:func:`topk_indices`);
* ``threshold``: the threshold selectors' common part and the CPU host path's dispatch;
* ``dgc``, ``redsync``, ``randomk``: the other selectors;
* ``sidco`` (the selector, with ``fits``), ``sidco_host`` (its stages on host scalars),
  ``sidco_native`` (the same in C), ``sidco_device`` (tensors off the CPU host path).
"""
from .base import Selector
from .dgc import DGCSelector
from .payload import SparseContext, SparsePayload
from .randomk import RandomKSelector
from .redsync import RedSyncSelector
from .sidco import SIDCoSelector
from .threshold import ThresholdSelector
from .topk import TopKSelector, topk_indices

__all__ = ["Selector", "ThresholdSelector", "TopKSelector", "DGCSelector", "RedSyncSelector",
           "SIDCoSelector", "RandomKSelector", "SparsePayload", "SparseContext", "topk_indices"]
