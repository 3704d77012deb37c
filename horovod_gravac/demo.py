"""Backward-compatible alias: this module moved to :mod:`horovod_gravac.harness.demo`.

``import horovod_gravac.demo`` gives that very module (same object), so old imports,
private names and monkeypatching keep working.
"""
import sys

from .harness import demo as _moved

if __name__ == "__main__":   # python -m horovod_gravac.demo
    sys.exit(_moved.main())
sys.modules[__name__] = _moved
