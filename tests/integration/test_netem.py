"""Tests of the emulated network (benchmarks/netem.py), the probe and the cost model.

Pure tests run anywhere. Tests marked `needs_netns` build real network namespaces
and run only as root with iproute2; Horovod tests skip when Horovod is missing.
Every test has a timeout and removes what it creates.
"""
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import cost_model, net_probe, netem  # noqa: E402

# network namespaces and wall-clock bounds: after the parallel pass, one after another (one
# xdist group), beside at most the fault tests, which mostly wait
pytestmark = [pytest.mark.timeout(300), pytest.mark.serial, pytest.mark.xdist_group("netem")]

HAVE_NETNS = netem.namespace_support() is None
needs_netns = pytest.mark.skipif(not HAVE_NETNS, reason=f"no network namespaces: "
                                                        f"{netem.namespace_support()}")
try:
    import horovod.runner.http.http_server  # noqa: F401
    HAVE_HOROVOD = True
except Exception:
    HAVE_HOROVOD = False
needs_horovod = pytest.mark.skipif(not HAVE_HOROVOD, reason="Horovod is not installed")


def _dead_pid():
    pid = 4_000_000
    while netem._pid_alive(pid):
        pid += 1
    return pid


def _ours(run_id):
    return [ns for ns in netem.list_namespaces() if ns.startswith(f"hgv-{run_id}-")]


# ---------------------------------------------------------------------------
# parsing
# ---------------------------------------------------------------------------

def test_parse_rate_units():
    assert netem.parse_rate("100mbit") == 100e6
    assert netem.parse_rate("1gbit") == 1e9
    assert netem.parse_rate("1.5Gbit") == 1.5e9
    assert netem.parse_rate("500kbit") == 500e3
    assert netem.parse_rate("10mbps") == 80e6      # tc: bps = bytes per second
    for bad in ("fast", "100 furlongs", "-1mbit", "0mbit", ""):
        with pytest.raises(ValueError):
            netem.parse_rate(bad)


def test_parse_time_units():
    assert netem.parse_time("5ms") == pytest.approx(0.005)
    assert netem.parse_time("200us") == pytest.approx(200e-6)
    assert netem.parse_time("1s") == 1.0
    assert netem.parse_time("0ms") == 0.0
    assert netem.parse_time("7") == pytest.approx(0.007)   # bare number = ms, like tc
    with pytest.raises(ValueError):
        netem.parse_time("soon")


def test_subnet_must_be_private_24():
    assert netem.validate_subnet("10.231.0") == "10.231.0"
    assert netem.validate_subnet("192.168.77") == "192.168.77"
    assert netem.validate_subnet("172.20.1") == "172.20.1"
    for bad in ("8.8.8", "192.0.2", "10.0", "10.0.0.0", "10.300.1", "172.32.0"):
        with pytest.raises(ValueError):
            netem.validate_subnet(bad)


def test_tbf_burst_scales_with_rate_and_fits_frames():
    assert netem.tbf_burst_bytes(1e9) == 125_000           # 1 ms at 1 Gbit/s
    assert netem.tbf_burst_bytes(100e6) == 12_500
    assert netem.tbf_burst_bytes(1e6) >= 4 * 1514          # never below a few full frames


# ---------------------------------------------------------------------------
# command construction (pure)
# ---------------------------------------------------------------------------

def test_setup_commands_structure():
    rid = "123-abcdef"
    cmds = netem.setup_commands(rid, 3, "100mbit", None, subnet="10.231.0")
    br = "hgv-123-abcdef-br"
    ranks = [f"hgv-123-abcdef-r{i}" for i in range(3)]
    added = [c[3] for c in cmds if c[:3] == ["ip", "netns", "add"]]
    assert added == [br] + ranks                              # bridge first, then ranks
    assert all(netem.NS_RE.match(n) for n in added)
    # Nothing is created or changed in the root namespace: every command names a namespace.
    for c in cmds:
        assert c[:3] == ["ip", "netns", "add"] or c[:2] == ["ip", "-n"] or \
            c[:3] == ["ip", "netns", "exec"], c
    # one veth per rank, created in the bridge namespace with its peer in the rank's
    veths = [c for c in cmds if "veth" in c]
    assert len(veths) == 3
    for i, c in enumerate(veths):
        assert c[:3] == ["ip", "-n", br] and c[-2:] == ["netns", ranks[i]]
    # addresses: ranks .1 .2 .3, bridge .254, all in the /24
    addrs = [c[c.index("add") + 1] for c in cmds if "addr" in c]
    assert sorted(addrs) == ["10.231.0.1/24", "10.231.0.2/24", "10.231.0.254/24", "10.231.0.3/24"]
    # every link shaped in both directions: rank egress + bridge-port egress
    tbfs = [c for c in cmds if "tbf" in c]
    assert len(tbfs) == 6
    assert {c[3] for c in tbfs} == set(ranks) | {br}
    for c in tbfs:
        assert c[c.index("rate") + 1] == "100000000bit"
        assert int(c[c.index("burst") + 1]) == netem.tbf_burst_bytes(100e6)
        assert "latency" in c
    assert not any("netem" in c for c in cmds)


def test_no_rate_no_shaping():
    cmds = netem.setup_commands("1-aa", 2, None, None)
    assert not any("tc" in c for c in cmds)
    cmds = netem.setup_commands("1-aa", 2, None, "0ms")
    assert not any("tc" in c for c in cmds)


def test_delay_is_netem_root_with_tbf_child_on_rank_side_only():
    cmds = netem.qdisc_commands("ns", "hgv0", "1gbit", "5ms")
    assert len(cmds) == 2
    root, child = cmds
    assert root[-8:] == ["root", "handle", "1:", "netem", "delay", "5000us", "limit", "100000"]
    assert child[child.index("parent") + 1] == "1:1" and "tbf" in child
    # in the full setup only the rank side gets the delay (one-way delay = delay)
    full = netem.setup_commands("1-bb", 2, "1gbit", "5ms")
    netems = [c for c in full if "netem" in c]
    assert len(netems) == 2 and all(c[3].endswith(("-r0", "-r1")) for c in netems)
    assert netem.qdisc_commands("ns", "d", None, "2ms")[0][-8:-3] == ["root", "handle", "1:",
                                                                      "netem", "delay"]


def test_setup_rejects_bad_sizes():
    with pytest.raises(ValueError):
        netem.setup_commands("1-aa", 0, None, None)
    with pytest.raises(ValueError):
        netem.setup_commands("1-aa", 251, None, None)


def test_teardown_covers_every_namespace_created():
    rid = "77-beef"
    created = {c[3] for c in netem.setup_commands(rid, 4, "1gbit", None)
               if c[:3] == ["ip", "netns", "add"]}
    deleted = {c[3] for c in netem.teardown_commands(rid, 4)}
    assert created == deleted


@needs_horovod
def test_horovod_env_matches_what_gloo_run_sets():
    from horovod.runner import gloo_run
    from horovod.runner.common.util.hosts import SlotInfo
    mine = netem.horovod_env(2, 3, "hostX", "10.231.0.254", 4242, "hgv0", gloo_timeout=45)
    slot = SlotInfo(hostname="hostX", rank=2, local_rank=0, cross_rank=2, size=3, local_size=1,
                    cross_size=3)
    theirs = dict(gloo_run.create_slot_env_vars(slot))
    theirs.update({k: str(v) for k, v in
                   gloo_run.create_run_env_vars("10.231.0.254", ["hgv0"], 4242).items()})
    for k, v in theirs.items():
        assert mine[k] == v, k
    assert mine["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"


def test_rank_command_shape():
    env = {"A": "1", "B": "x y"}
    cmd = netem.rank_command(["python", "t.py"], "hgv-1-aa-r0", env)
    assert cmd[:5] == ["ip", "netns", "exec", "hgv-1-aa-r0", "env"]
    assert cmd[5:7] == ["A=1", "B=x y"] and cmd[-2:] == ["python", "t.py"]
    assert netem.rank_command(["python"], None, {})[:1] == ["env"]


def test_hosts_file_maps_machine_hostname_to_rank_address():
    text = netem.netns_hosts_file("9-ab", 3, 1, "10.231.0", machine_hostname="myhost")
    lines = [l.split() for l in text.splitlines()]
    owners = [l[0] for l in lines if "myhost" in l[1:]]
    assert owners == ["10.231.0.2"]                         # only there, never 127.0.0.1
    assert ["127.0.0.1", "localhost"] in lines
    assert any(l[0] == "10.231.0.3" and "hgv-9-ab-host2" in l for l in lines)


def test_leftover_selection_by_owner_pid():
    dead = _dead_pid()
    names = [f"hgv-{dead}-abc123-r0", f"hgv-{dead}-abc123-br", f"hgv-{os.getpid()}-def456-r0",
             "hgv-notours", "other-ns", "hgv-1x-zz-r0"]
    assert netem.leftover_namespaces(names=names) == names[:2]
    assert netem.leftover_namespaces(all_runs=True, names=names) == names[:3]


def test_remove_etc_dir_only_touches_our_names(tmp_path, monkeypatch):
    monkeypatch.setattr(netem, "NETNS_ETC", str(tmp_path))
    ours = tmp_path / f"hgv-{_dead_pid()}-aaaaaa-r0"
    theirs = tmp_path / "someone-else"
    for d in (ours, theirs):
        d.mkdir()
        (d / "hosts").write_text("x")
    netem._remove_etc_dir(theirs.name)
    netem._remove_etc_dir(ours.name)
    assert theirs.exists() and not ours.exists()
    ours.mkdir()
    assert netem.leftover_etc_dirs() == [ours.name]


def test_show_commands_cli(capsys):
    assert netem.main(["show-commands", "--np", "2", "--rate", "100mbit"]) == 0
    out = capsys.readouterr().out
    assert "tbf rate 100000000bit" in out and "# teardown" in out and "ip netns del" in out


# ---------------------------------------------------------------------------
# fallback and launcher (no root needed)
# ---------------------------------------------------------------------------

def test_fallback_when_namespaces_unavailable(monkeypatch, capfd):
    monkeypatch.setattr(netem, "namespace_support", lambda: "not running as root (test)")
    with netem.EmulatedCluster(2, "100mbit") as c:
        assert c.mode == "localhost" and not c.shaped
        assert c.iface == "lo" and c.address(1) == "127.0.0.1" and c.rank_ns(0) is None
        assert "FALLBACK" in c.describe() and "NO rate limit" in c.describe()
    err = capfd.readouterr().err
    assert "falling back to plain localhost" in err and "not running as root (test)" in err
    with pytest.raises(RuntimeError, match="unavailable"):
        netem.EmulatedCluster(2, "100mbit", allow_fallback=False).setup()


@needs_horovod
def test_localhost_ranks_get_horovod_env():
    code = ("import os; print(os.environ['HOROVOD_RANK'], os.environ['HOROVOD_SIZE'],"
            " os.environ['HOROVOD_GLOO_IFACE'], os.environ['HOROVOD_GLOO_RENDEZVOUS_ADDR'],"
            " os.environ['EXTRA'])")
    res = netem.run_ranks([sys.executable, "-c", code], 3, None, None, 60, {"EXTRA": "yes"},
                          force_localhost=True)
    assert [r.rank for r in res] == [0, 1, 2]
    assert [r.stdout.split() for r in res] == [[str(i), "3", "lo", "127.0.0.1", "yes"]
                                              for i in range(3)]
    assert all(r.returncode == 0 and r.mode == "localhost" for r in res)


@needs_horovod
def test_failing_rank_kills_the_others_and_reports():
    code = ("import os, sys, time\n"
            "if os.environ['HOROVOD_RANK'] == '1':\n"
            "    print('boom on rank 1', file=sys.stderr); sys.exit(7)\n"
            "time.sleep(120)\n")
    t0 = time.monotonic()
    with pytest.raises(netem.RanksFailed) as ei:
        netem.run_ranks([sys.executable, "-c", code], 3, None, None, 90, {}, force_localhost=True)
    assert time.monotonic() - t0 < 30                     # not the sleep, not the timeout
    res = ei.value.results
    assert res[1].returncode == 7 and not res[1].killed
    assert res[0].killed and res[2].killed and res[0].returncode != 0
    assert "rank 1 exited with 7" in str(ei.value) and "boom on rank 1" in str(ei.value)
    for r in res:                                          # nobody left running
        assert not netem._pid_alive(r.pid)


@needs_horovod
def test_timeout_kills_all_ranks():
    t0 = time.monotonic()
    res = netem.run_ranks([sys.executable, "-c", "import time; time.sleep(120)"], 2, None, None,
                          2.0, {}, force_localhost=True, check=False)
    assert time.monotonic() - t0 < 20
    assert all(r.timed_out and r.killed and r.returncode != 0 for r in res)
    with pytest.raises(netem.RanksFailed, match="timed out"):
        netem.run_ranks([sys.executable, "-c", "import time; time.sleep(120)"], 2, None, None,
                        1.0, {}, force_localhost=True)


# ---------------------------------------------------------------------------
# real namespaces (root + iproute2)
# ---------------------------------------------------------------------------

@needs_netns
def test_real_cluster_setup_isolation_and_teardown():
    with netem.EmulatedCluster(3, "100mbit") as c:
        assert c.mode == "netns"
        assert sorted(_ours(c.run_id)) == sorted(c.namespaces + [c.bridge_namespace])
        for r, ns in enumerate(c.namespaces):
            addr = subprocess.run(["ip", "-n", ns, "-4", "-o", "addr", "show", "dev", "hgv0"],
                                  capture_output=True, text=True, timeout=10).stdout
            assert f"10.231.0.{r + 1}/24" in addr
            routes = subprocess.run(["ip", "-n", ns, "route"], capture_output=True, text=True,
                                    timeout=10).stdout.strip().splitlines()
            assert len(routes) == 1 and routes[0].startswith("10.231.0.0/24"), routes
            # no route anywhere else: nothing can leave the emulated cluster
            out = subprocess.run(["ip", "-n", ns, "route", "get", "192.0.2.2"],
                                 capture_output=True, text=True, timeout=10)
            assert out.returncode != 0 and "unreachable" in out.stderr.lower()
            q = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "hgv0"],
                               capture_output=True, text=True, timeout=10).stdout
            assert "tbf" in q and "rate 100Mbit" in q
            hosts = Path(netem.NETNS_ETC, ns, "hosts").read_text()
            assert f"10.231.0.{r + 1}\t" in hosts
        q = subprocess.run(["ip", "netns", "exec", c.bridge_namespace, "tc", "qdisc", "show"],
                           capture_output=True, text=True, timeout=10).stdout
        assert q.count("rate 100Mbit") == 3
        run_id = c.run_id
    assert _ours(run_id) == []
    assert not any(Path(netem.NETNS_ETC, n).exists()
                   for n in [f"hgv-{run_id}-r{i}" for i in range(3)] + [f"hgv-{run_id}-br"])


@needs_netns
@pytest.mark.parametrize("rate,mbit", [("100mbit", 100.0), ("1gbit", 1000.0)])
def test_tcp_through_rate_limit(rate, mbit):
    nbytes = int(mbit * 1e6 / 8 * 0.8)       # about 0.8 s of traffic at the rate
    with netem.EmulatedCluster(3, rate) as c:
        r01 = netem.measure_tcp(c, 0, 1, nbytes, timeout=60)
        r21 = netem.measure_tcp(c, 2, 0, nbytes, timeout=60)
    for r in (r01, r21):
        assert r["bytes"] == nbytes
        # TCP payload over 1500-byte frames is at most 1448/1514 = 95.6 % of the line rate;
        # the shaper must hold it: well above half, never above the rate.
        assert 0.5 * mbit < r["mbit_s"] <= 1.0 * mbit, r


@needs_netns
def test_unshaped_links_are_much_faster_than_shaped():
    with netem.EmulatedCluster(2, None) as c:
        fast = netem.measure_tcp(c, 0, 1, 20_000_000, timeout=60)["mbit_s"]
    assert fast > 1500                            # veth without tbf: far beyond 100 Mbit/s


@needs_netns
def test_delay_applied_or_clear_error():
    try:
        c = netem.EmulatedCluster(2, "100mbit", "20ms").setup()
    except netem.ShapingUnavailable as e:
        assert "netem" in str(e) and "--delay" in str(e)
        assert [n for n in netem.list_namespaces()
                if n.startswith(f"hgv-{os.getpid()}-")] == []  # nothing left behind
        return
    try:
        code = ("import socket,sys,time\nt=time.perf_counter()\ns=socket.socket()\n"
                "s.settimeout(5)\ntry: s.connect((sys.argv[1], 9))\nexcept OSError: pass\n"
                "print(time.perf_counter()-t)")
        out = subprocess.run(c.exec_prefix(0) + [sys.executable, "-c", code, c.address(1)],
                             capture_output=True, text=True, timeout=30).stdout
        assert float(out) >= 0.019                # SYN out is delayed by 20 ms
    finally:
        c.teardown()


@needs_netns
def test_cleanup_removes_only_dead_runs_leftovers():
    dead, live = f"hgv-{_dead_pid()}-c1ea00-r0", f"hgv-{os.getpid()}-c1ea01-r0"
    try:
        for ns in (dead, live):
            subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
        os.makedirs(os.path.join(netem.NETNS_ETC, dead), exist_ok=True)
        removed = netem.cleanup_leftovers()
        assert dead in removed and live not in removed
        names = netem.list_namespaces()
        assert dead not in names and live in names
        assert not os.path.exists(os.path.join(netem.NETNS_ETC, dead))
    finally:
        for ns in (dead, live):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        try:
            os.rmdir(netem.NETNS_ETC)
        except OSError:
            pass


@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_tears_down(sig):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from benchmarks import netem
        with netem.EmulatedCluster(2, "100mbit") as c:
            print(c.run_id, flush=True)
            time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        run_id = p.stdout.readline().strip()
        assert run_id and len(_ours(run_id)) == 3
        p.send_signal(sig)
        p.wait(timeout=30)
        assert p.returncode != 0
        assert _ours(run_id) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        netem.cleanup_leftovers(verbose=False)


@needs_netns
@needs_horovod
def test_sigterm_during_run_ranks_kills_ranks_and_tears_down():
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from benchmarks import netem
        print(os.getpid(), flush=True)
        netem.run_ranks([sys.executable, "-c", "import time; time.sleep(120)"], 2, "100mbit",
                        None, 100, {{}})
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = p.stdout.readline().strip()
        deadline = time.monotonic() + 60
        pids = []
        while time.monotonic() < deadline:      # wait until both ranks run in their netns
            nss = [n for n in netem.list_namespaces() if n.startswith(f"hgv-{pid}-")
                   and not n.endswith("-br")]
            pids = [int(x) for n in nss for x in subprocess.run(
                ["ip", "netns", "pids", n], capture_output=True, text=True,
                timeout=10).stdout.split()]
            if len(nss) == 2 and len(pids) >= 2:
                break
            time.sleep(0.2)
        assert len(pids) >= 2, "ranks did not start"
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        assert p.returncode != 0
        assert not any(netem._pid_alive(x) for x in pids)
        assert [n for n in netem.list_namespaces() if n.startswith(f"hgv-{pid}-")] == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        netem.cleanup_leftovers(verbose=False)


@needs_netns
@needs_horovod
@pytest.mark.parallel
def test_two_rank_horovod_allreduce_through_namespaces():
    code = textwrap.dedent("""
        import socket, torch, horovod.torch as hvd
        hvd.init()
        x = torch.full((1 << 18,), float(hvd.rank() + 1))
        y = hvd.allreduce(x, op=hvd.Sum, name="t")
        g = hvd.allgather(torch.full((3 + hvd.rank(),), float(hvd.rank())), name="g")
        print("OK", hvd.rank(), hvd.size(), float(y.min()), float(y.max()), g.tolist())
    """)
    res = netem.run_ranks([sys.executable, "-c", code], 2, "1gbit", None, 120, {})
    assert all(r.mode == "netns" and r.returncode == 0 for r in res)
    for r in res:
        words = r.stdout.split()
        assert words[:5] == ["OK", str(r.rank), "2", "3.0", "3.0"], r.stdout
        assert r.stdout.strip().endswith("[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]")
        assert "HOROVOD_GLOO_IFACE=hgv0" in r.args and r.args[:3] == ["ip", "netns", "exec"]


@needs_netns
@needs_horovod
@pytest.mark.parallel
def test_probe_end_to_end_small():
    rows = net_probe.run_probe(np=2, rate="100mbit", sizes="1MiB", repeats=2, timeout=120)
    assert {r["op"] for r in rows} == {"allreduce", "allgather"}
    for r in rows:
        assert r["mode"] == "netns" and r["bytes"] == 1 << 20
        # cannot beat the configured link; must reach a sane fraction of it
        assert 0.2 < r["busbw_over_rate"] <= 1.0, r


# ---------------------------------------------------------------------------
# probe helpers and cost model (pure)
# ---------------------------------------------------------------------------

def test_probe_sizes_and_wire_bytes():
    assert net_probe.parse_sizes("4KiB,1MiB,1MB") == [4096, 1 << 20, 1_000_000]
    assert net_probe.parse_size("10") == 8                  # whole float32s only
    with pytest.raises(ValueError):
        net_probe.parse_size("2")
    assert net_probe.wire_bytes("allreduce", 1000, 2) == 1000
    assert net_probe.wire_bytes("allreduce", 900, 3) == 1200
    assert net_probe.wire_bytes("allgather", 1000, 3) == 2000


def test_probe_output_parsing_and_csv_roundtrip(tmp_path):
    out = "noise\nPROBE {\"op\": \"allreduce\", \"np\": 2, \"bytes\": 1048576, \"repeats\": 3, " \
          "\"median_s\": 0.1, \"min_s\": 0.09, \"times_s\": [0.1]}\n"
    recs = net_probe.parse_output(out)
    row = net_probe.enrich(recs[0], "100mbit", None, "netns")
    assert row["algbw_mbit"] == pytest.approx(1048576 * 8 / 0.1 / 1e6)
    assert row["busbw_over_rate"] == pytest.approx(row["busbw_mbit"] / 100)
    loc = net_probe.enrich(recs[0], "100mbit", None, "localhost")
    assert loc["rate"] == "none" and loc["busbw_over_rate"] is None
    path = tmp_path / "p.csv"
    net_probe.write_csv([row, loc], str(path))
    back = net_probe.read_csv(str(path))
    assert back[0]["bytes"] == 1048576 and back[0]["median_ms"] == pytest.approx(100.0)
    assert back[1]["busbw_over_rate"] is None
    assert "NOTE: localhost" in net_probe.format_table([loc])


def test_cost_model_formulas_match_paper():
    link = cost_model.Link(alpha=1e-5, beta=1e-9)
    n, m = 32, 1e8
    assert cost_model.ring_allreduce(m, n, link) == pytest.approx(2 * 31 * 1e-5 + 2 * m * 1e-9 * 31 / 32)
    assert cost_model.tree_allreduce(m, n, link) == pytest.approx(2 * 1e-5 * 5 + 2 * m * 5 * 1e-9)
    assert cost_model.ring_allgather(1e6, n, link) == pytest.approx(31 * 1e-5 + 31 * 1e6 * 1e-9)
    assert cost_model.tree_allgather(1e6, n, link) == pytest.approx(5 * 1e-5 + 31 * 1e6 * 1e-9)
    assert cost_model.ring_allreduce(m, 1, link) == 0.0
    over = cost_model.Link(alpha=0, beta=0, overhead=0.003)
    assert cost_model.ring_allgather(123, 4, over) == pytest.approx(0.003)


def test_sparse_payload_and_fusion():
    link = cost_model.Link.nominal(10e9)
    p = 44_500_000
    assert cost_model.kept_elements(p, 1000) == 44_500
    assert cost_model.kept_elements(p, 1000, density=0.002) == 89_000
    t = cost_model.sparse_sync_time(p, 1000, 32, link)
    assert t == pytest.approx(31 * 44_500 * 8 * 8 / 10e9)
    # 170 MiB of gradients -> two 128 MiB fusion buffers, same bytes as one big allreduce
    dense = cost_model.dense_sync_time(p, 32, link)
    assert dense == pytest.approx(cost_model.ring_allreduce(p * 4, 32, link))
    slow = cost_model.Link(alpha=1e-3, beta=link.beta)
    assert cost_model.dense_sync_time(p, 32, slow) == pytest.approx(
        cost_model.ring_allreduce(p * 4, 32, link) + 2 * 62 * 1e-3)


def test_projection_shape_and_speedups():
    link = cost_model.Link.nominal(10e9, alpha=20e-6)
    meas = {("*", -1.0): cost_model.Measurement(compute_s=0.1),
            ("vgg16", 10.0): cost_model.Measurement(compress_s=0.05, density=0.1)}
    rows = cost_model.project({"vgg16": 138_000_000}, [1, 10, 1000], 32, link, meas)
    by = {r["cf"]: r for r in rows}
    assert by[1]["speedup_vs_dense"] == 1.0 and by[10]["speedup_vs_cf10"] == 1.0
    assert by[10]["compress_ms"] == pytest.approx(50.0) and by[10]["compute_ms"] == pytest.approx(100.0)
    # at CF 10, an allgather of values+indices moves more than the dense ring allreduce
    assert by[10]["sync_ring_ms"] > by[1]["sync_ring_ms"]
    assert by[1000]["step_ms"] < by[1]["step_ms"]
    assert by[1000]["step_ms"] == pytest.approx(
        100 + 1e3 * cost_model.sparse_sync_time(138_000_000, 1000, 32, link))


def test_fit_recovers_known_link_and_agreement():
    true = cost_model.Link(alpha=0.5e-3, beta=8 / 90e6, overhead=2e-3)
    rows = []
    for n in (2, 3):
        for op in ("allreduce", "allgather"):
            for b in (4096, 65536, 1 << 20, 1 << 24):
                t = cost_model.collective_time(op, b, n, true)
                rows.append({"mode": "netns", "rate": "100mbit", "np": n, "op": op, "bytes": b,
                             "median_ms": t * 1e3})
    fit = cost_model.fit_probe(rows)["100mbit"]
    assert fit.alpha == pytest.approx(true.alpha, rel=1e-6)
    assert fit.beta == pytest.approx(true.beta, rel=1e-6)
    assert fit.overhead == pytest.approx(true.overhead, rel=1e-6)
    agr = cost_model.agreement(rows, {"100mbit": fit})
    assert len(agr) == len(rows)
    assert all(a["measured_over_fitted"] == pytest.approx(1.0) for a in agr)
    assert all(a["measured_over_nominal"] > 1.0 for a in agr)   # overheads make it slower
    assert {a["in_fit"] for a in agr if a["op"] == "allgather"} == {False}


def test_measurements_csv(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("model,cf,compute_s,compress_s,decompress_s,density,source\n"
                 "resnet101,,0.2,,,,gpu\n"
                 "resnet101,100,,0.01,0.002,0.011,topk\n"
                 "*,1000,,0.005,,,any\n")
    meas = cost_model.load_measurements(str(p))
    m = cost_model.lookup(meas, "resnet101", 100)
    assert (m.compute_s, m.compress_s, m.decompress_s, m.density) == (0.2, 0.01, 0.002, 0.011)
    assert cost_model.lookup(meas, "resnet101", 1000).compress_s == 0.005
    assert cost_model.lookup(meas, "resnet101", 1000).compute_s == 0.2
    assert cost_model.lookup(meas, "vgg16", 10).compute_s == 0.0


def test_committed_probe_results_are_sane():
    path = ROOT / "benchmarks" / "results" / "net_probe.csv"
    if not path.exists():
        pytest.skip("no committed probe results")
    rows = net_probe.read_csv(str(path))
    shaped = [r for r in rows if r["mode"] == "netns"]
    assert shaped, "probe results must come from the emulated network"
    for r in shaped:
        assert r["busbw_over_rate"] <= 1.0 + 1e-9, r       # nothing beats the shaper
    big = [r for r in shaped if r["bytes"] >= 1 << 22 and r["rate"] == "100mbit"
           and r["op"] == "allreduce"]
    assert big and all(r["busbw_over_rate"] > 0.5 for r in big)


def test_cost_model_agrees_with_committed_probe_where_link_bound():
    path = ROOT / "benchmarks" / "results" / "net_probe.csv"
    if not path.exists():
        pytest.skip("no committed probe results")
    rows = net_probe.read_csv(str(path))
    agr = cost_model.agreement(rows)
    big = [a for a in agr if a["rate"] == "100mbit" and a["bytes"] >= 1 << 20]
    assert big
    # Link-bound dense allreduce: the alpha-beta fit is within 30 % of every measurement.
    for a in big:
        if a["op"] == "allreduce":
            assert 0.7 < a["measured_over_fitted"] < 1.3, a
    # Nothing is faster than the bare link allows.
    assert all(a["measured_over_nominal"] > 1.0 for a in big)
