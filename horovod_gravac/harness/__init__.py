"""The training application built on the library: a harness that trains the paper's
workloads under ``horovodrun`` (:mod:`.train`), its data loaders (:mod:`.data` for files,
:mod:`.synthetic` for data sets drawn on the spot, both returning :mod:`.images`' ``ImageData``)
and models (:mod:`.models`), the run directory it writes and the one reader of it
(:mod:`.runlog`), the report (:mod:`.report`) and the embedded default demo (:mod:`.demo`).

The library (``horovod_gravac`` outside this subpackage) never imports from here.
Submodules are not imported eagerly, so ``python -m horovod_gravac.harness.train``
runs without a double-import warning.
"""
