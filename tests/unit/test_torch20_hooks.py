"""The optimizer's hooks on torch 2.0, which has no ``register_post_accumulate_grad_hook``:
each parameter's gradient accumulator node carries the hook instead (as in Horovod's own
optimizer).  Forced on this torch, one rank: the same training as the default path, step for
step, across accumulation, a layer unfrozen late and a garbage collection (autograd holds the
node weakly: a node nobody keeps is rebuilt, without the hook, for the next graph)."""
import gc

import pytest
import torch

hvd = pytest.importorskip("horovod.torch")
import horovod_gravac as hg  # noqa: E402
import horovod_gravac.optimizer as optimizer  # noqa: E402
from horovod_gravac.compressors import TopKCompressor  # noqa: E402


def _train(node_hooks, monkeypatch, wrap=True, **kwargs):
    """Six steps with the first layer's weight frozen until step 3; the parameters, and the
    (step, bucket) launched by hooks (synchronize launches the rest).  ``wrap=False``: plain SGD."""
    monkeypatch.setattr(optimizer, "ACCUMULATOR_NODE_HOOKS", node_hooks)
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model[0].weight.requires_grad_(False)   # frozen at wrap time, unfrozen at step 3
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fired, in_backward = [], [False]
    if wrap:
        opt = hg.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kwargs)
        backend = opt.backend   # a bucket's collective starts when its last hook fires
        for method in ("allreduce_async", "allgather_async", "pair_exchange_async"):
            start = getattr(backend, method)

            def started(tensor, name, *args, start=start, **kw):
                if in_backward[0] and ".bucket." in name:
                    fired.append((step, int(name.rsplit(".bucket.", 1)[1])))
                return start(tensor, name, *args, **kw)
            setattr(backend, method, started)
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        if step == 3:
            model[0].weight.requires_grad_(True)
        gc.collect()
        opt.zero_grad()
        for _ in range(kwargs.get("backward_passes_per_step", 1)):
            loss = model(torch.randn(4, 6, generator=g)).pow(2).mean()
            in_backward[0] = True
            loss.backward()
            in_backward[0] = False
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), fired


@pytest.mark.parametrize("kwargs", [{}, dict(backward_passes_per_step=2),
                                    dict(compression=TopKCompressor(2))], ids=["dense", "bpps2", "topk"])
def test_accumulator_node_hooks_train_like_post_accumulate_hooks(kwargs, monkeypatch):
    if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
        pytest.skip("torch 2.0: no post-accumulate hooks to compare with")
    want, fired_want = _train(False, monkeypatch, **kwargs)
    got, fired = _train(True, monkeypatch, **kwargs)
    assert fired == fired_want and {step for step, _ in fired} == set(range(6))   # hooks launch every step
    assert torch.equal(got, want)


def test_accumulator_node_hooks_train_like_plain_torch_on_one_rank(monkeypatch):
    """One rank averages nothing: the dense controller's step is plain SGD's, with or without
    torch's post-accumulate hooks (on torch 2.0 this is the reference there is)."""
    got, fired = _train(True, monkeypatch, backward_passes_per_step=2)
    assert {step for step, _ in fired} == set(range(6))
    want, _ = _train(True, monkeypatch, wrap=False, backward_passes_per_step=2)
    assert torch.allclose(got, want, atol=1e-7)


def test_accumulator_node_hooks_keep_their_node(monkeypatch):
    monkeypatch.setattr(optimizer, "ACCUMULATOR_NODE_HOOKS", True)
    p = torch.nn.Parameter(torch.ones(3))
    calls = []
    keep = optimizer._after_grad_accumulated(p, calls.append)
    for _ in range(3):
        gc.collect()
        (p * 2).sum().backward()
    assert calls == [p, p, p] and torch.equal(p.grad, torch.full((3,), 6.0))
    keep.remove()   # as a hook handle's: the hook no longer fires
    (p * 2).sum().backward()
    assert len(calls) == 3
