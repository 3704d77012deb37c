"""Backward-compatible alias: this module moved to :mod:`horovod_gravac.harness.report`.

``import horovod_gravac.report`` gives that very module (same object), so old imports,
private names and monkeypatching keep working.
"""
import sys

from .harness import report as _moved

if __name__ == "__main__":   # python -m horovod_gravac.report
    sys.exit(_moved.main())
sys.modules[__name__] = _moved
