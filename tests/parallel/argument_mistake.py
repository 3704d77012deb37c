"""One rank's view of a common mistake at construction, under horovodrun (run by
tests/integration/test_argument_errors.py): ``compressor=`` given Horovod's compression.

    python argument_mistake.py WHO LATE [link]

WHO: ``all`` (every rank passes ``compressor=hvd.Compression.fp16``) or a rank number (only
that rank does; the others build a valid optimizer).  With ``link``, the mistake is an
unreadable ``$HOROVOD_GRAVAC_EMULATE_LINK`` instead.  LATE: the rank that reaches the
constructor 3 s after the others, as a rank that loads its data more slowly would.  The
error is not caught: the test reads what each rank printed before it exited."""
import sys
import time

import torch

import horovod.torch as hvd
import horovod_gravac as hg

who, late = sys.argv[1], int(sys.argv[2])
hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
if hvd.rank() == late:
    time.sleep(3.0)
mistaken = who == "all" or int(who) == hvd.rank()
link = len(sys.argv) > 3 and sys.argv[3] == "link"
kwargs = dict(compressor=hvd.Compression.fp16) if mistaken and not link else dict(compressor=hg.TopKCompressor)
if mistaken and link:
    import os
    from horovod_gravac.link_emulation import EMULATE_ENV
    os.environ[EMULATE_ENV] = "fast"
print(f"CONSTRUCTING mistaken={mistaken}", flush=True)
hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                        controller=hg.StaticCF(2), timeout_s=60, **kwargs)
print("CONSTRUCTED", flush=True)
