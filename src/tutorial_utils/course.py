"""Facts about the course itself, kept in one place.

The repository address appears in every notebook (the "Open in Colab" badge and the
Colab setup cell). ``tests/test_course.py`` checks each notebook against the values
here, and ``python tools/sync_colab.py`` rewrites the badge and setup cell when they change.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Where the course lives. Change it here, then run ``python tools/sync_colab.py``.
REPOSITORY = "https://github.com/gpu-memory-course/pytorch-gpu-memory"
BRANCH = "main"


@dataclass(frozen=True)
class Notebook:
    filename: str
    title: str
    minutes: int  # time a learner needs, reading and running every cell
    runs_on: str  # where every cell runs for real


NOTEBOOKS: tuple[Notebook, ...] = (
    Notebook(
        "00_start_here.ipynb",
        "Start here: the environment, the gauge, what the numbers mean",
        20,
        "CPU, 1 GPU, 2+ GPUs",
    ),
    Notebook(
        "01_moving_tensors.ipynb", "Moving tensors between devices", 30, "CPU, 1 GPU, 2+ GPUs"
    ),
    Notebook(
        "02_creating_tensors_on_the_right_device.ipynb",
        "Creating tensors on the right device",
        25,
        "CPU, 1 GPU, 2+ GPUs",
    ),
    Notebook(
        "03_data_parallelism.ipynb",
        "Data parallelism: DataParallel, DDP with torchrun, FSDP2",
        45,
        "CPU (gloo), 2+ GPUs (NCCL)",
    ),
    Notebook(
        "04_model_parallelism.ipynb", "Model parallelism and pipelines", 40, "CPU (gloo), 2+ GPUs"
    ),
    Notebook(
        "05_out_of_memory.ipynb",
        "Out-of-memory troubleshooting",
        50,
        "CPU (budget), 1 GPU (real OOM)",
    ),
    Notebook(
        "06_mixed_precision_and_cudnn.ipynb",
        "Mixed precision and cuDNN settings",
        40,
        "CPU (bf16), 1 GPU (fp16, bf16, TF32, cuDNN)",
    ),
    Notebook("07_capstone_make_it_fit.ipynb", "Capstone: make it fit", 45, "CPU (budget), 1 GPU"),
)


def colab_url(filename: str) -> str:
    """The address that opens ``notebooks/<filename>`` from the repository in Colab."""
    path = REPOSITORY.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{path}/blob/{BRANCH}/notebooks/{filename}"


def colab_badge(filename: str) -> str:
    """The markdown line at the top of each notebook."""
    return (
        f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"({colab_url(filename)})"
    )


def colab_setup_source() -> str:
    """The first code cell of each notebook: it does something only on Colab.

    On Colab it clones the repository (the notebooks read scripts from ``notebooks/scripts``),
    installs the helper package from that clone (not editable: a running kernel would not see
    an editable install), and changes into ``notebooks/``.
    """
    return (
        "# Colab only: fetch the course and install its helpers. Elsewhere this cell does nothing.\n"
        "import os\n"
        "\n"
        'if "COLAB_RELEASE_TAG" in os.environ:\n'
        f"    !git clone -q --depth 1 --branch {BRANCH} {REPOSITORY} /content/course || git -C /content/course pull -q\n"
        "    %pip install -q /content/course\n"
        "    %cd /content/course/notebooks"
    )
