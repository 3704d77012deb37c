"""Backward-compatible alias: this module moved to :mod:`horovod_gravac.harness.models`.

``import horovod_gravac.models`` gives that very module (same object), so old imports,
private names and monkeypatching keep working.
"""
import sys

from .harness import models as _moved

sys.modules[__name__] = _moved
