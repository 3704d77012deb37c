#!/usr/bin/env python3
"""Emulated multi-node cluster on one Linux machine, for Horovod (Gloo) benchmarks.

Each rank runs in its own network namespace. Every rank namespace has one veth
link to a Linux bridge that lives in a separate "bridge" namespace, so any number
of ranks can reach each other. Each link gets a token-bucket rate limit
(``tc qdisc ... tbf``) in both directions, optionally a one-way delay
(``tc qdisc ... netem delay``) on the rank's side, which models a node whose NIC
runs at ``rate`` full duplex with ``delay`` of one-way latency to every peer.

Addresses come from one private /24 (default 10.231.0.0/24) that exists only
inside these namespaces: the namespaces have no route anywhere else, and the
root namespace is never touched, so traffic can only flow between the addresses
of the namespaces created here. Horovod's Gloo rendezvous server runs in the
bridge namespace on the bridge's own address.

Names: every namespace is ``hgv-<pid>-<hex>-r<rank>`` or ``hgv-<pid>-<hex>-br``
(pid of the process that created it plus a random tag), so parallel runs never
collide and leftovers of crashed runs are identifiable (``--cleanup`` removes
those whose owner process is gone; ``--cleanup --all`` removes every ``hgv-``
namespace).

Teardown happens on normal exit, on exceptions, on Ctrl-C and on SIGTERM/SIGHUP
(context manager + atexit + signal handlers).

When namespaces cannot be created (not root, no ``ip``/``tc``, no permission),
everything falls back to plain localhost ranks without any rate limit, and says
so loudly (``EmulatedCluster.mode == "localhost"``).

CLI::

    python -m benchmarks.netem probe --np 2 --rate 100mbit          # bandwidth probe
    python -m benchmarks.netem run --np 3 --rate 1gbit -- python x.py
    python -m benchmarks.netem show-commands --np 2 --rate 100mbit --delay 5ms
    python -m benchmarks.netem --cleanup [--all]

Library::

    from benchmarks.netem import run_ranks
    results = run_ranks([sys.executable, "train.py"], np=2, rate="100mbit",
                        delay=None, timeout=600, env={})
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

PREFIX = "hgv-"
DEFAULT_SUBNET = "10.231.0"          # the /24 used inside the namespaces only
BRIDGE_HOST = 254                    # bridge address: <subnet>.254
RANK_IFACE = "hgv0"                  # rank side of each veth (inside the rank namespace)
BRIDGE_DEV = "hgvbr"                 # the bridge (inside the bridge namespace)
NS_RE = re.compile(r"^hgv-(\d+)-([0-9a-f]+)-(r\d+|br)$")
IP_TIMEOUT = 20.0                    # seconds for any single ip/tc command
TBF_LATENCY = os.environ.get("HGV_TBF_LATENCY", "20ms")  # tbf queue depth, as time at the rate
NETNS_ETC = "/etc/netns"             # `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/*


def log(msg: str) -> None:
    print(f"[netem] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Pure helpers: parsing and command construction (no root needed, unit-tested)
# ---------------------------------------------------------------------------

_RATE_UNITS = {
    "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9,  # tc's convention: bps = bytes/s
}


def parse_rate(rate: str) -> float:
    """'100mbit' -> 1e8 bits per second (tc's units; 'bps' means bytes/s as in tc)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(rate))
    if not m:
        raise ValueError(f"cannot parse rate {rate!r} (examples: 100mbit, 1gbit, 500kbit)")
    value, unit = float(m.group(1)), (m.group(2).lower() or "bit")
    if unit not in _RATE_UNITS:
        raise ValueError(f"unknown rate unit {unit!r} in {rate!r}; use one of {sorted(_RATE_UNITS)}")
    bps = value * _RATE_UNITS[unit]
    if bps <= 0:
        raise ValueError(f"rate must be positive: {rate!r}")
    return bps


def parse_time(t: str) -> float:
    """'5ms' -> 0.005 seconds; accepts s, ms, us; a bare number means ms (as tc does)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|ms|us|usec|msec|sec)?\s*", str(t))
    if not m:
        raise ValueError(f"cannot parse time {t!r} (examples: 0ms, 5ms, 200us)")
    value, unit = float(m.group(1)), (m.group(2) or "ms")
    scale = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}[unit]
    return value * scale


def tbf_burst_bytes(rate_bps: float, mtu: int = 1500) -> int:
    """Token-bucket depth: about 1 ms worth of the rate, at least 4 full frames.

    Small enough that the shaped rate holds on a time scale of milliseconds, large
    enough that the qdisc watchdog does not have to fire for every packet at 1 Gbit/s.
    """
    return int(max(4 * (mtu + 14), rate_bps / 8 * 1e-3))


def make_run_id() -> str:
    return f"{os.getpid()}-{secrets.token_hex(3)}"


def ns_name(run_id: str, rank: int) -> str:
    return f"{PREFIX}{run_id}-r{rank}"


def bridge_ns_name(run_id: str) -> str:
    return f"{PREFIX}{run_id}-br"


def bridge_port_name(rank: int) -> str:
    return f"hgvp{rank}"


def rank_addr(subnet: str, rank: int) -> str:
    return f"{subnet}.{rank + 1}"


def bridge_addr(subnet: str) -> str:
    return f"{subnet}.{BRIDGE_HOST}"


def validate_subnet(subnet: str) -> str:
    parts = subnet.split(".")
    if len(parts) != 3 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
        raise ValueError(f"subnet must be the first three octets of a /24, e.g. 10.231.0: {subnet!r}")
    a, b = int(parts[0]), int(parts[1])
    private = a == 10 or (a == 172 and 16 <= b <= 31) or (a == 192 and b == 168)
    if not private:
        raise ValueError(f"subnet {subnet}.0/24 is not a private (RFC 1918) range")
    return subnet


def qdisc_commands(ns: str, dev: str, rate: Optional[str], delay: Optional[str]) -> List[List[str]]:
    """tc commands shaping egress of `dev` in namespace `ns`.

    rate only:   root tbf.
    delay only:  root netem delay.
    both:        root netem delay (handle 1:) with a tbf child (parent 1:1): packets
                 are delayed, then shaped.
    """
    cmds: List[List[str]] = []
    has_delay = delay is not None and parse_time(delay) > 0
    tbf = []
    if rate is not None:
        bps = parse_rate(rate)
        tbf = ["tbf", "rate", f"{int(bps)}bit", "burst", str(tbf_burst_bytes(bps)), "latency", TBF_LATENCY]
    base = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev]
    if has_delay:
        delay_us = int(round(parse_time(delay) * 1e6))
        cmds.append(base + ["root", "handle", "1:", "netem", "delay", f"{delay_us}us", "limit", "100000"])
        if tbf:
            cmds.append(base + ["parent", "1:1", "handle", "10:"] + tbf)
    elif tbf:
        cmds.append(base + ["root", "handle", "1:"] + tbf)
    return cmds


def setup_commands(run_id: str, np: int, rate: Optional[str], delay: Optional[str],
                   subnet: str = DEFAULT_SUBNET) -> List[List[str]]:
    """Every ip/tc command that builds the emulated cluster, in order."""
    if np < 1:
        raise ValueError("np must be >= 1")
    if np > 250:
        raise ValueError("at most 250 ranks fit in one /24")
    validate_subnet(subnet)
    br = bridge_ns_name(run_id)
    cmds = [
        ["ip", "netns", "add", br],
        ["ip", "-n", br, "link", "set", "lo", "up"],
        ["ip", "-n", br, "link", "add", BRIDGE_DEV, "type", "bridge"],
        ["ip", "-n", br, "addr", "add", f"{bridge_addr(subnet)}/24", "dev", BRIDGE_DEV],
        ["ip", "-n", br, "link", "set", BRIDGE_DEV, "up"],
    ]
    for r in range(np):
        ns, port = ns_name(run_id, r), bridge_port_name(r)
        cmds += [
            ["ip", "netns", "add", ns],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            # veth created inside the bridge namespace, its peer moved straight into the
            # rank namespace: no interface ever appears in the root namespace.
            ["ip", "-n", br, "link", "add", port, "type", "veth", "peer", "name", RANK_IFACE,
             "netns", ns],
            ["ip", "-n", br, "link", "set", port, "master", BRIDGE_DEV],
            ["ip", "-n", br, "link", "set", port, "up"],
            ["ip", "-n", ns, "addr", "add", f"{rank_addr(subnet, r)}/24", "dev", RANK_IFACE],
            ["ip", "-n", ns, "link", "set", RANK_IFACE, "up"],
        ]
        # rank -> bridge: rate (+ delay); bridge -> rank: rate. Full duplex NIC model.
        cmds += qdisc_commands(ns, RANK_IFACE, rate, delay)
        cmds += qdisc_commands(br, port, rate, None)
    return cmds


def teardown_commands(run_id: str, np: int) -> List[List[str]]:
    """Deleting the namespaces deletes their veths and the bridge with them."""
    return ([["ip", "netns", "del", ns_name(run_id, r)] for r in range(np)]
            + [["ip", "netns", "del", bridge_ns_name(run_id)]])


def horovod_env(rank: int, size: int, hostname: str, rendezvous_addr: str,
                rendezvous_port: int, iface: str, gloo_timeout: Optional[int] = None) -> Dict[str, str]:
    """The variables horovodrun --gloo gives each rank (horovod/runner/gloo_run.py:
    create_slot_env_vars + create_run_env_vars), for one rank per emulated host."""
    env = {
        "HOROVOD_HOSTNAME": hostname,
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": str(rank),
        "HOROVOD_CROSS_SIZE": str(size),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
        "NCCL_SOCKET_IFNAME": iface,
        "PYTHONUNBUFFERED": "1",
    }
    if gloo_timeout is not None:
        env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(int(gloo_timeout))
    return env


def rank_command(cmd: Sequence[str], ns: Optional[str], env: Dict[str, str]) -> List[str]:
    """`ip netns exec NS env K=V ... cmd` (or `env K=V ... cmd` without a namespace)."""
    prefix = ["ip", "netns", "exec", ns] if ns else []
    return prefix + ["env"] + [f"{k}={v}" for k, v in env.items()] + list(cmd)


def rendezvous_hostnames(run_id: str, np: int) -> List[str]:
    return [f"hgv-{run_id}-host{r}" for r in range(np)]


def netns_hosts_file(run_id: str, np: int, rank: int, subnet: str = DEFAULT_SUBNET,
                     machine_hostname: Optional[str] = None) -> str:
    """/etc/hosts as seen by processes of rank `rank` (via /etc/netns/NS/hosts).

    Why: Horovod 0.28.1 builds the Gloo device of its process-set contexts (the global
    process set included) without HOROVOD_GLOO_IFACE (GlooContext::InitializeForProcessSet
    reads its own, empty, gloo_iface_), so Gloo falls back to resolving the machine's
    hostname, which /etc/hosts maps to 127.0.0.1: each rank would then advertise its own
    namespace's loopback to its peers. Inside each rank namespace the machine hostname
    must therefore resolve to that rank's link address.
    """
    host = machine_hostname or socket.gethostname()
    names = rendezvous_hostnames(run_id, np)
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    for r in range(np):
        extra = f" {host}" if r == rank else ""
        lines.append(f"{rank_addr(subnet, r)}\t{names[r]}{extra}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Running ip/tc
# ---------------------------------------------------------------------------

def _run(cmd: List[str], check: bool = True, timeout: float = IP_TIMEOUT) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"command failed ({p.returncode}): {shlex.join(cmd)}\n{p.stderr.strip()}")
    return p


class ShapingUnavailable(RuntimeError):
    """The namespaces work but the requested tc shaping (tbf / netem) does not."""


def namespace_support() -> Optional[str]:
    """None if namespaces + tc can be used here; else the reason why not."""
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform})"
    if os.geteuid() != 0:
        return "not running as root (network namespaces need CAP_SYS_ADMIN/CAP_NET_ADMIN)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' not found (Debian: apt-get install -y iproute2)"
    return None


def list_namespaces() -> List[str]:
    if shutil.which("ip") is None:
        return []
    p = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_pids_in_ns(ns: str) -> None:
    """Kill processes still running inside one of *our* namespaces."""
    p = _run(["ip", "netns", "pids", ns], check=False)
    pids = [int(x) for x in p.stdout.split() if x.isdigit() and int(x) != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in pids if _pid_alive(pid)]
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 2.0
        while time.time() < deadline and any(_pid_alive(pid) for pid in alive):
            time.sleep(0.05)


def leftover_namespaces(all_runs: bool = False, names: Optional[List[str]] = None) -> List[str]:
    """hgv- namespaces whose creating process is gone (or every hgv- one with all_runs)."""
    names = list_namespaces() if names is None else names
    out = []
    for name in names:
        m = NS_RE.match(name)
        if not m:
            continue
        if all_runs or not _pid_alive(int(m.group(1))):
            out.append(name)
    return out


def _remove_etc_dir(ns: str) -> None:
    if not NS_RE.match(ns):      # never touch anything that is not ours
        return
    shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)


def leftover_etc_dirs(all_runs: bool = False) -> List[str]:
    try:
        names = os.listdir(NETNS_ETC)
    except OSError:
        return []
    return leftover_namespaces(all_runs, names=names)


def cleanup_leftovers(all_runs: bool = False, verbose: bool = True) -> List[str]:
    """Remove leftover hgv- namespaces (their processes first) and their /etc/netns
    entries. Returns the namespaces removed."""
    removed = []
    for ns in leftover_namespaces(all_runs):
        _kill_pids_in_ns(ns)
        p = _run(["ip", "netns", "del", ns], check=False)
        if p.returncode == 0:
            removed.append(ns)
            if verbose:
                log(f"removed leftover namespace {ns}")
        elif verbose:
            log(f"could not remove {ns}: {p.stderr.strip()}")
        _remove_etc_dir(ns)
    for ns in leftover_etc_dirs(all_runs):
        _remove_etc_dir(ns)
    try:
        os.rmdir(NETNS_ETC)      # only if empty: other tools may use it
    except OSError:
        pass
    return removed


# ---------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------

class EmulatedCluster:
    """Context manager: builds the namespaces on enter, removes them on exit.

    mode == "netns":     ranks run in namespaces over rate-limited links.
    mode == "localhost": fallback, ranks run on 127.0.0.1 without any shaping.
    """

    def __init__(self, np: int, rate: Optional[str] = None, delay: Optional[str] = None,
                 subnet: str = DEFAULT_SUBNET, run_id: Optional[str] = None,
                 allow_fallback: bool = True, force_localhost: bool = False):
        if rate is not None:
            parse_rate(rate)
        if delay is not None:
            parse_time(delay)
        self.np = int(np)
        self.rate = rate
        self.delay = delay
        self.subnet = validate_subnet(subnet)
        self.run_id = run_id or make_run_id()
        self.allow_fallback = allow_fallback
        self.force_localhost = force_localhost
        self.mode: Optional[str] = None
        self.fallback_reason: Optional[str] = None
        self._created: List[str] = []
        self._lock = threading.Lock()
        self._prev_handlers: Dict[int, object] = {}
        self._atexit_registered = False

    # --- description ------------------------------------------------------
    @property
    def namespaces(self) -> List[str]:
        return [ns_name(self.run_id, r) for r in range(self.np)]

    @property
    def bridge_namespace(self) -> str:
        return bridge_ns_name(self.run_id)

    @property
    def shaped(self) -> bool:
        return self.mode == "netns" and (self.rate is not None or self.delay is not None)

    def rank_ns(self, rank: int) -> Optional[str]:
        return ns_name(self.run_id, rank) if self.mode == "netns" else None

    def address(self, rank: int) -> str:
        return rank_addr(self.subnet, rank) if self.mode == "netns" else "127.0.0.1"

    def port(self, default: int) -> int:
        """A port for rank 0's rendezvous: ``default`` inside this run's own namespaces, else
        one the system has free now (plain localhost ranks share the machine with other runs)."""
        if self.mode == "netns":
            return default
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    @property
    def iface(self) -> str:
        return RANK_IFACE if self.mode == "netns" else "lo"

    @property
    def server_ns(self) -> Optional[str]:
        return self.bridge_namespace if self.mode == "netns" else None

    @property
    def server_addr(self) -> str:
        return bridge_addr(self.subnet) if self.mode == "netns" else "127.0.0.1"

    def describe(self) -> str:
        if self.mode == "netns":
            return (f"netns: {self.np} ranks, namespaces {self.namespaces[0]}..,"
                    f" rate={self.rate or 'unlimited'} delay={self.delay or '0'}"
                    f" subnet={self.subnet}.0/24")
        return (f"localhost FALLBACK: {self.np} ranks on 127.0.0.1, NO rate limit, NO delay"
                f" ({self.fallback_reason})")

    # --- lifecycle ----------------------------------------------------------
    def setup(self) -> "EmulatedCluster":
        reason = "forced by caller" if self.force_localhost else namespace_support()
        if reason is None:
            try:
                self._install_guards()
                for cmd in setup_commands(self.run_id, self.np, self.rate, self.delay, self.subnet):
                    if cmd[:3] == ["ip", "netns", "add"]:
                        with self._lock:
                            self._created.append(cmd[3])
                    if "tc" in cmd[:5]:
                        self._run_tc(cmd)
                    else:
                        _run(cmd)
                self._write_hosts_files()
                self.mode = "netns"
                return self
            except ShapingUnavailable:
                self.teardown()
                raise
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                self.teardown()
                reason = f"namespace setup failed: {e}"
                if not self.allow_fallback:
                    raise RuntimeError(reason) from e
        elif not self.allow_fallback:
            raise RuntimeError(f"network namespaces unavailable: {reason}")
        self.mode = "localhost"
        self.fallback_reason = reason
        log("WARNING: cannot emulate the network with namespaces: " + reason)
        log("WARNING: falling back to plain localhost ranks WITHOUT rate limit or delay;"
            " timings will not reflect a constrained network.")
        return self

    def _write_hosts_files(self) -> None:
        for r in range(self.np):
            d = os.path.join(NETNS_ETC, ns_name(self.run_id, r))
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "hosts"), "w") as f:
                f.write(netns_hosts_file(self.run_id, self.np, r, self.subnet))

    def _run_tc(self, cmd: List[str]) -> None:
        """Shaping that cannot be installed is an error, never a silent fallback:
        an 'emulated' network without its rate limit would give misleading numbers."""
        p = _run(cmd, check=False)
        if p.returncode == 0:
            return
        kind = "netem" if "netem" in cmd else "tbf"
        hint = ""
        if "unknown" in p.stderr.lower():
            hint = (f" The kernel has no '{kind}' qdisc (CONFIG_NET_SCH_{kind.upper()});"
                    + (" run without --delay (or --delay 0ms)." if kind == "netem" else ""))
        raise ShapingUnavailable(f"cannot install the {kind} qdisc: {shlex.join(cmd)}:"
                                 f" {p.stderr.strip()}.{hint}")

    def teardown(self) -> None:
        with self._lock:
            created, self._created = self._created, []
        for ns in reversed(created):
            try:
                _kill_pids_in_ns(ns)
                _run(["ip", "netns", "del", ns], check=False)
            except Exception as e:  # keep going: remove as much as possible
                log(f"teardown of {ns} failed: {e}")
            _remove_etc_dir(ns)
        if created:
            try:
                os.rmdir(NETNS_ETC)  # only if empty (other runs or tools may use it)
            except OSError:
                pass
        self._remove_guards()

    def __enter__(self) -> "EmulatedCluster":
        return self.setup()

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _install_guards(self) -> None:
        if not self._atexit_registered:
            atexit.register(self.teardown)
            self._atexit_registered = True
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum, frame):
            # Unwind (with-blocks and finally clauses run, which tears down).
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._prev_handlers[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):
                pass
        # SIGINT already raises KeyboardInterrupt, unless someone ignored it.
        if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL):
            self._prev_handlers[signal.SIGINT] = signal.signal(signal.SIGINT,
                                                               signal.default_int_handler)

    def _remove_guards(self) -> None:
        if self._atexit_registered:
            atexit.unregister(self.teardown)
            self._atexit_registered = False
        if threading.current_thread() is threading.main_thread():
            for sig, prev in self._prev_handlers.items():
                try:
                    signal.signal(sig, prev)
                except (ValueError, OSError, TypeError):
                    pass
        self._prev_handlers.clear()

    def exec_prefix(self, rank: int) -> List[str]:
        ns = self.rank_ns(rank)
        return ["ip", "netns", "exec", ns] if ns else []


# ---------------------------------------------------------------------------
# Rendezvous server (Horovod's own, in the bridge namespace)
# ---------------------------------------------------------------------------

_SERVER_CODE = r"""
import sys, threading
from horovod.runner.common.util.hosts import parse_hosts, get_host_assignments
from horovod.runner.http.http_server import RendezvousHTTPServer, RendezvousHandler
addr, hosts, np = sys.argv[1], sys.argv[2], int(sys.argv[3])
httpd = RendezvousHTTPServer((addr, 0), RendezvousHandler, 0)  # port 0: the OS picks one
httpd.init(get_host_assignments(parse_hosts(hosts), np))
threading.Thread(target=httpd.serve_forever, daemon=True).start()
print(httpd.server_address[1], flush=True)
sys.stdin.read()          # until the launcher closes our stdin (or dies)
httpd.shutdown()
"""


class RendezvousProcess:
    """Horovod's RendezvousHTTPServer, bound to one address, in a child process
    (so it can live in the bridge namespace while the launcher stays in the root one)."""

    def __init__(self, cluster: EmulatedCluster, hostnames: List[str], python: str = sys.executable,
                 timeout: float = 60.0):
        hosts = ",".join(f"{h}:1" for h in hostnames)
        cmd = [python, "-c", _SERVER_CODE, cluster.server_addr, hosts, str(len(hostnames))]
        if cluster.server_ns:
            cmd = ["ip", "netns", "exec", cluster.server_ns] + cmd
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.port = self._read_port(timeout)
        self.addr = cluster.server_addr

    def _read_port(self, timeout: float) -> int:
        result: List[str] = []
        t = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        line = result[0].strip() if result else ""
        if not line.isdigit():
            self.stop()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"rendezvous server did not start (got {line!r}): {err[-2000:]}")
        return int(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except Exception:
                _kill_group(self.proc)
        for f in (self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except Exception:
                pass


# ---------------------------------------------------------------------------
# Raw TCP check of a link (no Horovod needed)
# ---------------------------------------------------------------------------

_TCP_RECV = r"""
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
s.settimeout(float(sys.argv[2])); c, _ = s.accept(); c.settimeout(float(sys.argv[2]))
n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.perf_counter()
    n += len(b)
t1 = time.perf_counter()
print(n, t1 - t0, flush=True)
"""

_TCP_SEND = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
left = int(sys.argv[3]); buf = b"x" * (1 << 20)
while left > 0:
    k = c.send(buf[:min(left, len(buf))]); left -= k
c.shutdown(socket.SHUT_WR); c.recv(1); c.close()
"""


def measure_tcp(cluster: "EmulatedCluster", src: int, dst: int, nbytes: int = 8 << 20,
                timeout: float = 60.0, python: str = sys.executable) -> Dict[str, float]:
    """Send nbytes over TCP from rank src's namespace to rank dst's; returns
    {'bytes', 'seconds', 'mbit_s'} measured at the receiver (first to last byte)."""
    recv_cmd = cluster.exec_prefix(dst) + [python, "-c", _TCP_RECV, cluster.address(dst), str(timeout)]
    recv = subprocess.Popen(recv_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        port_line: List[str] = []
        t = threading.Thread(target=lambda: port_line.append(recv.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not port_line or not port_line[0].strip().isdigit():
            raise RuntimeError(f"TCP receiver did not start: {port_line!r}")
        send_cmd = cluster.exec_prefix(src) + [python, "-c", _TCP_SEND, cluster.address(dst),
                                               port_line[0].strip(), str(nbytes), str(timeout)]
        subprocess.run(send_cmd, check=True, timeout=timeout, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
        out, err = recv.communicate(timeout=timeout)
        n, secs = out.split()
        n, secs = int(n), float(secs)
        return {"bytes": n, "seconds": secs, "mbit_s": n * 8 / secs / 1e6}
    finally:
        _kill_group(recv)


# ---------------------------------------------------------------------------
# Launching ranks
# ---------------------------------------------------------------------------

class RankResult(subprocess.CompletedProcess):
    """CompletedProcess plus rank, wall time, timeout flag and the network mode."""

    def __init__(self, args, returncode, stdout, stderr, rank, elapsed, timed_out, killed, mode,
                 pid=None):
        super().__init__(args, returncode, stdout, stderr)
        self.rank = rank
        self.pid = pid
        self.elapsed = elapsed
        self.timed_out = timed_out
        self.killed = killed      # killed by the launcher because another rank failed
        self.mode = mode


class RanksFailed(RuntimeError):
    def __init__(self, message: str, results: List[RankResult]):
        super().__init__(message)
        self.results = results


def _kill_group(proc: subprocess.Popen, grace: float = 3.0) -> None:
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(text: str, n: int = 3000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def launch_ranks(cluster: EmulatedCluster, cmd: Sequence[str], timeout: float,
                 env: Optional[Dict[str, str]] = None, python: str = sys.executable,
                 check: bool = True, gloo_timeout: Optional[int] = None,
                 log_dir: Optional[str] = None) -> List[RankResult]:
    """Run `cmd` once per rank inside an already set-up cluster.

    Every rank gets the Horovod Gloo variables; output goes to files (no pipe
    deadlocks) and is returned. If a rank fails, the others are killed; if the
    timeout passes, all are killed. check=True raises RanksFailed on any failure.
    """
    np = cluster.np
    hostnames = rendezvous_hostnames(cluster.run_id, np)
    base_env = dict(os.environ)
    base_env.update(env or {})
    if gloo_timeout is None:
        gloo_timeout = int(max(30, min(timeout, 300)))
    server = RendezvousProcess(cluster, hostnames, python=python, timeout=min(timeout, 60))
    own_tmp = log_dir is None
    log_dir = log_dir or tempfile.mkdtemp(prefix="hgv-ranks-")
    os.makedirs(log_dir, exist_ok=True)
    procs: List[subprocess.Popen] = []
    files = []
    argvs = []
    start = time.monotonic()
    ends: Dict[int, float] = {}
    timed_out = False
    killed = set()
    try:
        for r in range(np):
            henv = horovod_env(r, np, hostnames[r], server.addr, server.port, cluster.iface,
                               gloo_timeout)
            argv = rank_command(cmd, cluster.rank_ns(r), henv)
            argvs.append(argv)
            out = open(os.path.join(log_dir, f"rank{r}.out"), "w+")
            err = open(os.path.join(log_dir, f"rank{r}.err"), "w+")
            files.append((out, err))
            procs.append(subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                          env=base_env, start_new_session=True))
        deadline = start + timeout
        while True:
            codes = [p.poll() for p in procs]
            now = time.monotonic()
            for r, c in enumerate(codes):
                if c is not None and r not in ends:
                    ends[r] = now - start
            if all(c is not None for c in codes):
                break
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                for r, p in enumerate(procs):
                    if p.poll() is None:
                        killed.add(r)
                        _kill_group(p)
                break
            if now > deadline:
                timed_out = True
                for r, p in enumerate(procs):
                    if p.poll() is None:
                        killed.add(r)
                        _kill_group(p)
                break
            time.sleep(0.05)
    finally:
        for p in procs:          # Ctrl-C / exceptions: never leave ranks behind
            _kill_group(p, grace=1.0)
        server.stop()
    results = []
    for r, p in enumerate(procs):
        out, err = files[r]
        out.seek(0)
        err.seek(0)
        so, se = out.read(), err.read()
        out.close()
        err.close()
        results.append(RankResult(argvs[r], p.returncode, so, se, r,
                                  ends.get(r, time.monotonic() - start),
                                  timed_out and r in killed, r in killed, cluster.mode, p.pid))
    if own_tmp:
        shutil.rmtree(log_dir, ignore_errors=True)
    bad = [res for res in results if res.returncode != 0]
    if check and bad:
        first = min((res for res in bad if not res.killed), key=lambda res: res.elapsed,
                    default=bad[0])
        why = ("timed out after %.0f s" % timeout) if timed_out else \
            f"rank {first.rank} exited with {first.returncode}"
        msg = (f"{why}; killed ranks: {sorted(killed) or 'none'}\n"
               f"--- rank {first.rank} stderr (tail) ---\n{_tail(first.stderr)}\n"
               f"--- rank {first.rank} stdout (tail) ---\n{_tail(first.stdout, 1000)}")
        raise RanksFailed(msg, results)
    return results


def run_ranks(cmd: List[str], np: int, rate: Optional[str] = None, delay: Optional[str] = None,
              timeout: float = 600.0, env: Optional[Dict[str, str]] = None, *,
              check: bool = True, subnet: str = DEFAULT_SUBNET, allow_fallback: bool = True,
              force_localhost: bool = False, log_dir: Optional[str] = None,
              gloo_timeout: Optional[int] = None) -> List[RankResult]:
    """Build an emulated cluster, run `cmd` as `np` Horovod ranks on it, tear it down.

    Returns one RankResult (a subprocess.CompletedProcess) per rank, with `.mode`
    ("netns" or "localhost" fallback), `.elapsed`, `.timed_out`, `.killed`.
    """
    with EmulatedCluster(np, rate, delay, subnet=subnet, allow_fallback=allow_fallback,
                         force_localhost=force_localhost) as cluster:
        return launch_ranks(cluster, cmd, timeout, env=env, check=check,
                            gloo_timeout=gloo_timeout, log_dir=log_dir)


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_cmd(args) -> int:
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        log("nothing to run: give a command after --")
        return 2
    try:
        results = run_ranks(cmd, args.np, args.rate, args.delay, args.timeout,
                            force_localhost=args.localhost, check=False)
    except Exception as e:
        log(f"error: {e}")
        return 1
    rc = 0
    for res in results:
        for line in res.stdout.splitlines():
            print(f"[{res.rank}] {line}")
        for line in res.stderr.splitlines():
            print(f"[{res.rank}] {line}", file=sys.stderr)
        if res.returncode != 0:
            why = " (timed out)" if res.timed_out else (" (killed after another rank failed)"
                                                        if res.killed else "")
            log(f"rank {res.rank} exited with {res.returncode}{why}")
            rc = rc or (res.returncode if res.returncode > 0 else 1)
    return rc


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["probe"]:
        # The probe lives in benchmarks.net_probe, which imports this module (to launch its
        # ranks); run it as its own command rather than import it back here.
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        return subprocess.call([sys.executable, "-m", "benchmarks.net_probe", *argv[1:]], env=env)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cleanup", action="store_true",
                    help="remove leftover hgv- namespaces of runs whose process is gone, then exit")
    ap.add_argument("--all", action="store_true",
                    help="with --cleanup: remove every hgv- namespace, even of live runs")
    sub = ap.add_subparsers(dest="command")

    def common(p):
        p.add_argument("--np", type=int, default=2)
        p.add_argument("--rate", default=None, help="per-rank link rate, e.g. 100mbit, 1gbit")
        p.add_argument("--delay", default=None, help="one-way delay per link, e.g. 0ms, 5ms")
        p.add_argument("--timeout", type=float, default=600.0, help="seconds, per run")
        p.add_argument("--localhost", action="store_true",
                       help="skip namespaces (plain localhost, no shaping)")

    sub.add_parser("probe", help="measure allreduce/allgather bandwidth through the emulation "
                                 "(runs python -m benchmarks.net_probe with the same arguments; "
                                 "see its --help)")
    p = sub.add_parser("run", help="run a command as Horovod ranks in the emulated cluster")
    common(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p = sub.add_parser("show-commands", help="print the ip/tc commands, change nothing")
    common(p)
    sub.add_parser("list", help="list hgv- namespaces")
    args = ap.parse_args(argv)

    if args.cleanup:
        if namespace_support() is not None:
            log(f"nothing to clean up: {namespace_support()}")
            return 0
        removed = cleanup_leftovers(all_runs=args.all)
        log(f"removed {len(removed)} namespace(s)")
        return 0
    if args.command == "run":
        return _run_cmd(args)
    if args.command == "show-commands":
        rid = make_run_id()
        for c in setup_commands(rid, args.np, args.rate, args.delay):
            print(shlex.join(c))
        print("# teardown")
        for c in teardown_commands(rid, args.np):
            print(shlex.join(c))
        return 0
    if args.command == "list":
        for ns in list_namespaces():
            if ns.startswith(PREFIX):
                stale = " (stale)" if ns in leftover_namespaces(names=[ns]) else ""
                print(ns + stale)
        return 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
