"""Backward-compatible alias: this module moved to :mod:`horovod_gravac.harness.data`.

``import horovod_gravac.data`` gives that very module (same object), so old imports,
private names and monkeypatching keep working.
"""
import sys

from .harness import data as _moved

sys.modules[__name__] = _moved
