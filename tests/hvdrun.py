"""``horovodrun`` for the tests, without its build probe at every launch.

Before it starts any rank, horovodrun asks whether Horovod was built with Gloo (or MPI) by
forking a process that imports ``horovod.torch``, and so torch: about 1.5 CPU-s and 1.5-3 s
of wall time a launch on 2 busy cores, and the suite launches some 70 jobs.  The tests'
launcher (tests/launcher.py) asks once per pytest process, with the same functions, and
passes the answers in ``$HOROVOD_GRAVAC_TEST_BUILT`` ("gloo=1,mpi=0"); this runs
horovodrun's own command line (``horovod.runner.launch.run_commandline``) with them.
Without that variable it is plain horovodrun, probe included.

    python tests/hvdrun.py -np 2 -H localhost:2 --gloo python script.py
"""
import os
import sys

from horovod.runner import launch

BUILT_ENV = "HOROVOD_GRAVAC_TEST_BUILT"


def main():
    built = os.environ.pop(BUILT_ENV, "")
    if built:
        answers = dict(item.split("=", 1) for item in built.split(","))
        # launch.py calls these names (imported from horovod.common.util) for its checks
        launch.gloo_built = lambda verbose=False: answers["gloo"] == "1"
        launch.mpi_built = lambda verbose=False: answers["mpi"] == "1"
    sys.argv[0] = "horovodrun"
    return launch.run_commandline()


if __name__ == "__main__":
    sys.exit(main())
