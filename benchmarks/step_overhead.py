"""GraVAC step cost against a static-CF step at the same CF, side by side in one run.

Run under horovodrun (no bandwidth limit: loopback), e.g.
    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.step_overhead

Configurations are interleaved round-robin (50 rounds of 4 steps) so machine noise hits
all of them alike.  The table reports the median step time of each and its ratio to the
static twin at the same CF: the median over rounds of the ratio of the two blocks' mean
step times (each GraVAC block runs right after its static twin, so slow drift of a
shared machine cancels), and, as a cross-check, the ratio of the two medians.  GraVAC is measured in two states:
  settled    - theta_min == candidate == CF (what a converged GraVAC run does), so the
               extra cost is the per-step norms, which ride in the last bucket's
               collective (the pinned controller never reaches a window check, so no
               state is exchanged; before commit 1e4bb89 rank 0's decision was
               broadcast every step);
  exploring  - theta_min = CF/10, candidate = CF (multi-level: compress at CF/10, then
               further), sending the candidate: the cost while it is still searching.
  settled-local - settled, with the exchange replaced by each rank observing its own step
               locally (``--no-broadcast-row``; a diagnostic only, safe here because the
               pinned decision never changes).  It measured the per-step broadcast's share
               (``results/step_overhead_broadcast.txt``, made at commit 6fd4fb9); since
               1e4bb89 it runs the same computation as ``settled``.
Target: GraVAC <= 1.15x static at the same CF, checked on the settled state
(same CF sent and compressed).  While exploring, GraVAC must compress the whole gradient
at theta_min = CF/10 (Algorithm 1, line 6) before reaching CF by multi-level compression;
that row is compared with static at CF and, for reference, with static at theta_min
(which compresses at the same level but sends 10x more): information, not the target.
"""
import argparse
import os
import statistics
import time

import torch

import horovod.torch as hvd
import horovod_gravac as hg
from horovod_gravac.controllers import Decision, PaperGraVAC


def make_model(width):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 10))


def timed_steps(model, opt, x, y, steps):
    """Wall seconds of each of ``steps`` training steps on one batch (zero_grad, forward,
    backward, ``opt.step()``)."""
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        out.append(time.perf_counter() - t0)
    return out


class PinnedGraVAC(PaperGraVAC):
    """GraVAC doing all its per-step work (both levels, gains, consensus) but pinned to
    one decision, so the comparison is at exactly the same CF."""

    def __init__(self, theta_min, candidate):
        super().__init__(theta_min=theta_min, theta_max=max(candidate, theta_min), epsilon=0.01,
                         window=10 ** 9, variant="paper")
        self.pinned = Decision(candidate, theta_min, candidate)
        self.adopt(self.pinned)

    def observe(self, obs):
        super().observe(obs)
        self.decision = self.pinned
        return self.decision


class LocalExchange:
    """Diagnostic stand-in for the decision broadcast: every rank observes its own step and
    nothing is sent.  Only for a pinned controller, whose decision cannot differ by rank."""

    def __init__(self, controller):
        self.controller = controller

    def start(self, step_stats, step_time, world, at_boundary, observe, stats):
        from horovod_gravac.consensus import observation
        if observe:
            self.controller.observe(observation(step_stats, step_time, world, at_boundary))

    def drop(self):
        pass

    def sync_state(self, step_index, name):
        return step_index   # every rank starts from the same freshly built controller


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=1024, help="hidden width (params ~ 2*width^2)")
    ap.add_argument("--cfs", type=float, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--steps", type=int, default=4, help="timed steps per round (short rounds: drift hits all alike)")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--compressor", default="topk", choices=["topk", "randomk"])
    ap.add_argument("--no-broadcast-row", action="store_true",
                    help="also time the settled state without the decision broadcast (diagnostic)")
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    comp = hg.TopKCompressor if args.compressor == "topk" else hg.RandomKCompressor
    configs = []
    static_cfs = sorted(set(args.cfs) | {cf / 10 for cf in args.cfs if cf / 10 > 1})
    for cf in static_cfs:
        if cf not in args.cfs:   # only the reference for an exploring row
            configs.append((cf, "static", lambda cf=cf: hg.StaticCF(cf)))
    for cf in args.cfs:
        configs.append((cf, "static", lambda cf=cf: hg.StaticCF(cf)))
        configs.append((cf, "gravac-settled", lambda cf=cf: PinnedGraVAC(cf, cf)))
        if args.no_broadcast_row:
            configs.append((cf, "settled-local", lambda cf=cf: PinnedGraVAC(cf, cf)))
        if cf / 10 >= 1:
            configs.append((cf, "gravac-exploring", lambda cf=cf: PinnedGraVAC(cf / 10, cf)))
    runners = []
    for cf, name, make in configs:
        model = make_model(args.width)
        opt = hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                      named_parameters=model.named_parameters(), compressor=comp,
                                      controller=make())
        if name == "settled-local":
            opt._exchange = LocalExchange(opt._controller)
        runners.append((cf, name, model, opt, []))
    g = torch.Generator().manual_seed(hvd.rank())
    x, y = torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)
    blocks = {id(opt): [] for _, _, _, opt, _ in runners}   # mean step time per round
    for rnd in range(args.rounds + 1):          # round 0 is warm-up
        for cf, name, model, opt, times in runners:
            block = timed_steps(model, opt, x, y, args.steps)
            opt.stats   # let the last consensus exchange finish inside its own block
            if rnd:
                times.extend(block)
                blocks[id(opt)].append(statistics.fmean(block))
    nparams = sum(p.numel() for p in runners[0][2].parameters())
    if hvd.rank() == 0:
        print(f"# {hvd.size()} ranks, {nparams / 1e6:.2f}M parameters, {args.compressor}, "
              f"median of {args.rounds}x{args.steps} interleaved steps")
        print(f"{'CF':>6} {'mode':<17} {'step ms':>8} {'vs static':>9} {'target':>7} {'of medians':>10} "
              f"{'vs static theta_min':>20}")
        static = {cf: statistics.median(times) * 1e3 for cf, name, _, _, times in runners if name == "static"}
        static_blocks = {cf: blocks[id(opt)] for cf, name, _, opt, _ in runners if name == "static"}
        failed = 0
        for cf, name, _, opt, times in runners:
            if cf not in args.cfs:
                continue
            med = statistics.median(times) * 1e3
            if name == "static":
                print(f"{cf:>6g} {name:<17} {med:>8.2f} {'1.00x':>9}")
                continue
            ratio = statistics.median(g / s for g, s in zip(blocks[id(opt)], static_blocks[cf]))
            of_medians = f"{med / static[cf]:.2f}x"
            if name == "settled-local":
                print(f"{cf:>6g} {name:<17} {med:>8.2f} {ratio:>8.2f}x {'info':>7} {of_medians:>10}")
            elif name == "gravac-settled":
                failed += ratio > 1.15
                print(f"{cf:>6g} {name:<17} {med:>8.2f} {ratio:>8.2f}x {'PASS' if ratio <= 1.15 else 'FAIL':>7} "
                      f"{of_medians:>10}")
            else:
                ref = static.get(cf / 10)
                vs_min = f"{med / ref:.2f}x (CF {cf / 10:g})" if ref else "- (theta_min 1: dense)"
                print(f"{cf:>6g} {name:<17} {med:>8.2f} {ratio:>8.2f}x {'info':>7} {of_medians:>10} {vs_min:>20}")
        print(f"# load average {os.getloadavg()[0]:.1f}; {failed} target(s) failed")


if __name__ == "__main__":
    main()
