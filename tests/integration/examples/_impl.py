"""Pick the DistributedOptimizer for the example copies: Horovod's or horovod_gravac's.

``--impl hvd``: ``hvd.DistributedOptimizer``.  ``--impl hg``: ``hg.DistributedOptimizer``
with the chosen ``--controller`` bound by ``functools.partial``; every other argument is
the example's own, passed exactly as to Horovod's.
"""
import functools
import hashlib

import torch


def add_impl_args(parser):
    parser.add_argument('--impl', choices=['hvd', 'hg'], default='hvd',
                        help='hvd: hvd.DistributedOptimizer; hg: horovod_gravac.DistributedOptimizer')
    parser.add_argument('--controller', choices=['dense', 'static', 'gravac'], default='dense',
                        help='horovod_gravac controller (with --impl hg)')
    parser.add_argument('--save-params', default=None, help='rank 0 saves the flat parameters here')


def distributed_optimizer(args, hvd):
    if args.impl == 'hvd':
        return hvd.DistributedOptimizer
    import horovod_gravac as hg
    controller = {'dense': lambda: hg.Dense(),
                  'static': lambda: hg.StaticCF(10),
                  'gravac': lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=5)}[args.controller]()
    return functools.partial(hg.DistributedOptimizer, controller=controller, timeout_s=60)


def report_params(args, hvd, model):
    """Rank 0 prints a hash of its parameters and how far the other ranks' are from them
    (``RANKS_MAX_DIFF 0.0``: every rank holds the same model)."""
    flat = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    everyone = hvd.allgather(flat.reshape(1, -1), name='report_params')
    if hvd.rank() == 0:
        if args.save_params:
            torch.save(flat, args.save_params)
        print('PARAMS_SHA %s' % hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
        print('RANKS_MAX_DIFF %r' % (everyone - flat).abs().max().item(), flush=True)
