"""ResNet101 (CIFAR shape, batch 32) forward/backward/SGD on the GPU with no distributed
optimizer: the compute floor the harness's step times are compared with."""
import statistics, sys, time
import torch, torch.nn.functional as F
from horovod_gravac.harness.models import build_model
dev = "cuda"
torch.manual_seed(0)
m = build_model("resnet101", num_classes=10).to(dev)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
x = torch.randn(32, 3, 32, 32, device=dev); y = torch.randint(0, 10, (32,), device=dev)
times = []
for i in range(60):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    opt.zero_grad(); loss = F.cross_entropy(m(x), y); loss.backward(); opt.step()
    torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
print(f"plain torch resnet101 b32: median step {statistics.median(times[10:])*1e3:.1f} ms "
      f"(steps 11-60; min {min(times[10:])*1e3:.1f}, max {max(times[10:])*1e3:.1f})")
