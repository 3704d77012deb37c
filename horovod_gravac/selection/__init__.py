"""Which entries a sparsifier keeps: the selection logic of the compressors, without Horovod.

Everything here is torch, NumPy and the native kernels (``horovod_gravac.native``); nothing
imports Horovod.  Each selector holds its parameters and ``select``/``select_payload``;
:mod:`horovod_gravac.compressors` turns each into a Horovod ``Compressor`` with a class of
no code of its own (``class TopKCompressor(TopKSelector, SparseCompressor)``).

* ``payload``: :class:`SparsePayload`, :class:`SparseContext` (what a sparsifier sends);
* ``base``: :class:`Selector` (``cf``, ``select``) and parameter checks;
* ``sampling``: stratified samples and draws, private per-device generators;
* ``kernels``: the threshold kernels (exceedance moments, ``|x| >= t`` selection);
* ``topk``: exact Top-k from a sampled threshold (:func:`topk_indices`);
* ``threshold``: the threshold selectors' common part and the CPU host path's dispatch;
* ``dgc``, ``redsync``, ``sidco`` (with ``fits``), ``randomk``: the other selectors.
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
