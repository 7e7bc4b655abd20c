"""Helpers for the PyTorch GPU memory and multi-GPU notebooks.

Each module has one job:

* ``devices``: find, describe and pick devices (CUDA, MPS, CPU); the one device resolver
* ``memory``: what the notebooks import; it re-exports the next two
* ``accounting``: exact memory counting: ``measure``, ``Tracker``, ``budget``
* ``anatomy``: what a training step holds: ``breakdown``, ``estimate``, ``spec``
* ``nvml``: NVIDIA's management library (what ``nvidia-smi`` reads) without hangs or tracebacks
* ``monitor``: sources of live readings (NVML, the torch allocator, GPUtil, psutil)
* ``gauges``: ``LiveGauge``, live bars and a timeline from those sources
* ``magics``: the ``%%peak`` cell magic (``%load_ext tutorial_utils``)
* ``timing``: timing that is right on GPUs (synchronize, events, warm-up, median)
* ``distributed``: launch a script with torchrun from a notebook
* ``processes``: child processes that die with their parent; external calls with a timeout
* ``models``: the small seeded demo models the notebooks share
* ``decoder_config``: the decoder's shape and real models' shapes (``PRESETS``), without torch
* ``decoder``: the course's GPT-2 / Llama-style decoder, and real models' shapes (``PRESETS``)
* ``formulas``: training memory by formula: parameters, bytes per parameter, activations
* ``fit``: the "will it fit" calculator, a file per job: one GPU's peak training memory for a
  decoder preset or config.json, by profile (DDP, ZeRO, FSDP1/2, TP/PP/CP) and knob
* ``fit_inputs``: the old import path of ``fit.inputs``, ``fit.presets``, ``fit.cards``
* ``fit_advice``: the old import path of ``fit.advice``
* ``calculator``: the old import path of ``fit.widget`` (``Calculator()``, notebook 03 names it)
* ``fit_cli``: the old import path of ``fit.cli`` (``python -m tutorial_utils fit``)
* ``exercises``: checkers that tell a learner what is wrong (one module per notebook)
* ``listing``: the named functions of a script, shown instead of the whole file
* ``recorded``: GPU results recorded on a real machine, shown beside their cells
* ``recorded_cluster``: two-node Slurm runs recorded on the course's cluster, shown in 07
* ``published``: GPU figures published by others, quoted with source, hardware and date
* ``doctor``: the environment as a table, and ``--require`` for a workshop preflight
* ``lab``: ``make lab``, JupyterLab on 127.0.0.1 with a private token
* ``course``: facts about the course kept in one place (the repository address)
* ``units``: byte counts in binary units (KiB, MiB, GiB)

Import the module you need::

    from tutorial_utils import devices, memory
"""

from __future__ import annotations

__version__ = "0.1.0"


def load_ipython_extension(ipython):  # %load_ext tutorial_utils
    from .magics import load_ipython_extension as _load

    _load(ipython)
