"""Sparse gradients (``nn.Embedding(sparse=True)``) without ``sparse_as_dense``: sent as
Horovod sends them, indices and values allgathered, uncompressed.  A parameter joins
on its first sparse gradient (the optimizer takes it out of its bucket then) and stays."""
from __future__ import annotations

from typing import Dict

import torch

from .accounting import StepRecord
from .transfers import Link


class SparseGradients:
    def __init__(self, link: Link, prefix: str):
        self.link, self.prefix = link, prefix
        self._info: Dict[torch.nn.Parameter, dict] = {}   # name, handles in flight, an empty gradient

    def __contains__(self, p) -> bool:
        return p in self._info

    def __iter__(self):
        return iter(self._info)

    def add(self, p, name: str) -> None:
        self._info[p] = {"name": name, "handles": None, "empty": None}

    def in_flight(self) -> bool:
        return any(info["handles"] is not None for info in self._info.values())

    def handles(self) -> list:
        """The handles of the allgathers started and not yet finished."""
        return [h for info in self._info.values() if info["handles"] is not None for h in info["handles"]]

    def launch(self, p, record: StepRecord) -> None:
        """Start the allgathers of ``p``'s sparse gradient."""
        info = self._info[p]
        grad = p.grad   # not coalesced, as Horovod: the same sums in the same order
        name = f"{self.prefix}.sparse.{info['name']}"
        backend = self.link.backend
        info["handles"] = (
            backend.allgather_async(grad._indices().transpose(0, 1).contiguous(), name + ".indices"),
            backend.allgather_async(grad._values(), name + ".values"))
        if info["empty"] is None:   # what to send on a step without a gradient here
            info["empty"] = torch.sparse_coo_tensor(grad._indices()[:, :0], grad._values()[:0], grad.size())
        record.bytes_sent += grad._values().numel() * grad._values().element_size() \
            + grad._indices().numel() * 8
        record.floats_sent += grad._values().numel()

    def finish(self, p, record: StepRecord) -> None:
        """Write the combined sparse gradient to ``p.grad``."""
        info = self._info[p]
        if info["handles"] is None:   # no gradient here this step: send an empty one
            if info["empty"] is None:
                return
            p.grad = info["empty"].clone()
            self.launch(p, record)
        h_idx, h_val = info["handles"]
        name = f"{self.prefix}.sparse.{info['name']}"
        backend = self.link.backend
        values = backend.wait(h_val, name + ".values", self.link.timeout)
        indices = backend.wait(h_idx, name + ".indices", self.link.timeout)
        values = values / self.link.world if self.link.average else values
        grad = p.grad
        aggregated = grad.new(indices.transpose(0, 1), values, grad.size()) \
            if indices.dim() and values.dim() else grad.new().resize_as_(grad)
        p.grad.zero_().add_(aggregated)
        info["handles"] = None
