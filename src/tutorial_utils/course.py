"""Facts about the course itself, kept in one place.

The repository address and release appear in every notebook (the "Open in Colab" badge and
the Colab setup cell), with a kernelspec and, where the notebook needs one, Colab's GPU
metadata. ``tests/test_course.py`` checks each notebook against the values here, and
``python tools/sync_colab.py`` rewrites them when they change.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Where the course lives. Change it here, then run ``python tools/sync_colab.py``.
REPOSITORY = "https://github.com/gpu-memory-course/pytorch-gpu-memory"
BRANCH = "main"  # where development happens; learners' links point at RELEASE instead
#: The tagged release these notebooks belong to: the Colab badge opens it, the Colab setup cell
#: installs exactly this tag (never the moving ``BRANCH``), Binder builds it. It is
#: ``v`` + the package's ``__version__`` (a test checks); bump both, then tag.
RELEASE = "v0.1.0"

#: Minutes a learner needs per notebook, estimated from its words, code lines, cells and
#: exercises (the formula and its inputs: docs/times.md). Never edit by hand:
#: ``python tools/course_times.py --write`` rewrites this block, ``--check`` compares it.
# BEGIN MINUTES (written by tools/course_times.py --write)
MINUTES: dict[str, int] = {
    "00_start_here.ipynb": 30,
    "01_moving_tensors.ipynb": 35,
    "02_creating_tensors_on_the_right_device.ipynb": 25,
    "03_where_memory_goes.ipynb": 50,
    "04_out_of_memory.ipynb": 45,
    "05_mixed_precision_and_cudnn.ipynb": 40,
    "06_capstone_make_it_fit.ipynb": 45,
    "07_data_parallelism.ipynb": 45,
    "08_model_parallelism.ipynb": 30,
    "09_zero_and_fsdp2.ipynb": 45,
    "10_tensor_and_sequence_parallelism.ipynb": 40,
    "11_capstone_make_it_fit_across_ranks.ipynb": 40,
    "12_long_context_and_experts.ipynb": 50,
    "13_fewer_bytes.ipynb": 60,
    "14_when_a_job_hangs.ipynb": 45,
}
# END MINUTES


@dataclass(frozen=True)
class Notebook:
    filename: str
    title: str
    minutes: int  # time a learner needs, reading and running every cell (MINUTES)
    runs_on: str  # where every cell runs for real

    @property
    def track(self) -> str:
        """Its track: the last of ``TRACK_STARTS`` whose first notebook number is at most its own
        (00-06 one device, 07-11 several devices, 12 on at scale)."""
        number = self.filename[:2]
        return [track for first, track in TRACK_STARTS.items() if first <= number][-1]


#: The tracks, in order, each with the number of its first notebook. The first two each end in
#: a capstone; the third ("at scale") is electives, outside the first two's time budget.
TRACK_STARTS = {"00": "one device", "07": "several devices", "12": "at scale"}
TRACKS = tuple(TRACK_STARTS.values())

NOTEBOOKS: tuple[Notebook, ...] = (
    Notebook(
        "00_start_here.ipynb",
        "Start here: the environment, the gauge, what the numbers mean",
        MINUTES["00_start_here.ipynb"],
        "CPU, 1 GPU, 2+ GPUs",
    ),
    Notebook(
        "01_moving_tensors.ipynb",
        "Moving tensors between devices",
        MINUTES["01_moving_tensors.ipynb"],
        "CPU, 1 GPU, 2+ GPUs",
    ),
    Notebook(
        "02_creating_tensors_on_the_right_device.ipynb",
        "Creating tensors on the right device",
        MINUTES["02_creating_tensors_on_the_right_device.ipynb"],
        "CPU, 1 GPU, 2+ GPUs",
    ),
    Notebook(
        "03_where_memory_goes.ipynb",
        "Where memory goes: predict, measure, reconcile",
        MINUTES["03_where_memory_goes.ipynb"],
        "CPU (every formula and tool), 1 GPU (offloading to pinned memory)",
    ),
    Notebook(
        "04_out_of_memory.ipynb",
        "Out-of-memory troubleshooting",
        MINUTES["04_out_of_memory.ipynb"],
        "CPU (budget), 1 GPU (real OOM)",
    ),
    Notebook(
        "05_mixed_precision_and_cudnn.ipynb",
        "Mixed precision and cuDNN settings",
        MINUTES["05_mixed_precision_and_cudnn.ipynb"],
        "CPU (bf16), 1 GPU (fp16, bf16, TF32, cuDNN)",
    ),
    Notebook(
        "06_capstone_make_it_fit.ipynb",
        "Capstone 1: make it fit",
        MINUTES["06_capstone_make_it_fit.ipynb"],
        "CPU (budget), 1 GPU",
    ),
    Notebook(
        "07_data_parallelism.ipynb",
        "Data parallelism: DataParallel, DDP, torchrun and Slurm",
        MINUTES["07_data_parallelism.ipynb"],
        "CPU (gloo), 2+ GPUs (NCCL)",
    ),
    Notebook(
        "08_model_parallelism.ipynb",
        "Model parallelism and pipelines",
        MINUTES["08_model_parallelism.ipynb"],
        "CPU (gloo), 2+ GPUs",
    ),
    Notebook(
        "09_zero_and_fsdp2.ipynb",
        "ZeRO and FSDP2: sharding the training state",
        MINUTES["09_zero_and_fsdp2.ipynb"],
        "CPU (gloo), 2+ GPUs (NCCL)",
    ),
    Notebook(
        "10_tensor_and_sequence_parallelism.ipynb",
        "Tensor and sequence parallelism, the 2-D mesh, which parallelism when",
        MINUTES["10_tensor_and_sequence_parallelism.ipynb"],
        "CPU (gloo), 2+ GPUs (NCCL)",
    ),
    Notebook(
        "11_capstone_make_it_fit_across_ranks.ipynb",
        "Capstone 2: make it fit across ranks",
        MINUTES["11_capstone_make_it_fit_across_ranks.ipynb"],
        "CPU (gloo), 2+ GPUs (NCCL)",
    ),
    Notebook(
        "12_long_context_and_experts.ipynb",
        "Long context and experts: ring attention, expert parallelism, HSDP",
        MINUTES["12_long_context_and_experts.ipynb"],
        "CPU (gloo, 2 and 4 ranks), 2+ GPUs (NCCL)",
    ),
    Notebook(
        "13_fewer_bytes.ipynb",
        "Fewer bytes: communication hooks, FP8, loss parallelism, newer pipeline schedules",
        MINUTES["13_fewer_bytes.ipynb"],
        "CPU (gloo), 1 GPU (FP8 matmul from compute capability 8.9)",
    ),
    Notebook(
        "14_when_a_job_hangs.ipynb",
        "When a job hangs: timeouts, monitored barriers, fingerprints, the flight recorder",
        MINUTES["14_when_a_job_hangs.ipynb"],
        "CPU (gloo), 2+ GPUs (NCCL, cited)",
    ),
)


#: The kernelspec every notebook carries (Colab, JupyterLab and nbclient read it).
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
#: The GPU Colab should give a notebook that has GPU cells worth running: the free tier's one.
COLAB_GPU = "T4"


def _repo_path() -> str:
    return REPOSITORY.removeprefix("https://github.com/")


def _notebook_name(filename: object) -> str:
    """``filename`` checked: the name of a notebook file in notebooks/, as every address needs."""
    if (
        not isinstance(filename, str)
        or not filename.endswith(".ipynb")
        or filename != filename.strip()
        or any(c in filename for c in "/\\?#%\0 ")
        or filename.startswith(".")
    ):
        raise ValueError(
            f"give a notebook's file name in notebooks/, like '00_start_here.ipynb'; got {filename!r}"
        )
    return filename


def colab_url(filename: str) -> str:
    """The address that opens ``notebooks/<filename>`` of release ``RELEASE`` in Colab."""
    filename = _notebook_name(filename)
    return f"https://colab.research.google.com/github/{_repo_path()}/blob/{RELEASE}/notebooks/{filename}"


def colab_badge(filename: str) -> str:
    """The markdown line at the top of each notebook."""
    return (
        f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"({colab_url(filename)})"
    )


def binder_url(filename: str = "00_start_here.ipynb") -> str:
    """The address that builds release ``RELEASE`` on Binder and opens ``notebooks/<filename>``."""
    filename = _notebook_name(filename)
    return (
        f"https://mybinder.org/v2/gh/{_repo_path()}/{RELEASE}?urlpath=lab/tree/notebooks/{filename}"
    )


def binder_badge(filename: str = "00_start_here.ipynb") -> str:
    """The README's Binder badge: it opens notebook 00."""
    return f"[![Binder](https://mybinder.org/badge_logo.svg)]({binder_url(filename)})"


def colab_setup_source() -> str:
    """The first code cell of each notebook: it does something only on Colab.

    On Colab it clones the course at the tag ``RELEASE`` (the notebooks read scripts from
    ``notebooks/scripts``), installs the helper package from that clone (not editable: a running
    kernel would not see an editable install), and changes into ``notebooks/``. A tag, not a
    branch: the package a learner installs is the one this notebook was tested with.
    """
    return (
        "# Colab only: fetch the course and install its helpers. Elsewhere this cell does nothing.\n"
        "import os\n"
        "\n"
        'if "COLAB_RELEASE_TAG" in os.environ:\n'
        f"    ![ -d /content/course ] || git clone -q --depth 1 --branch {RELEASE} {REPOSITORY} /content/course\n"
        "    %pip install -q /content/course\n"
        "    %cd /content/course/notebooks"
    )
