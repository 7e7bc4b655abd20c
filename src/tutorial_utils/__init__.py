"""Helpers for the PyTorch GPU memory and multi-GPU notebooks.

Each module has one job: ``devices`` (find and pick devices), ``memory`` (exact memory
measurement and estimation: ``accounting`` counts, ``anatomy`` dissects a training step), ``monitor`` and ``gauges`` (live readings), ``timing``,
``distributed`` (launch torchrun from a notebook), ``models`` (seeded demo models),
``exercises`` (checkers) and ``doctor`` (the environment). Import the module you need::

    from tutorial_utils import devices, memory
"""

from __future__ import annotations

__version__ = "0.1.0"


def load_ipython_extension(ipython):  # %load_ext tutorial_utils
    from .magics import load_ipython_extension as _load

    _load(ipython)
