"""What differs from machine to machine: torchrun's processes, the GPU's number formats and
memory, compilers, deterministic kernels. Each rule names the flag or the step that fixes it."""

import argparse
import contextlib
import importlib.util
import os
import shutil
import sys

import torch

import common
from plumbing.command_line import UsageError, as_words


def join_torchrun(device: torch.device) -> tuple[int, torch.device]:
    """Join the other processes that torchrun started; return (this one's rank, its device):
    (0, device) in a plain run."""
    if "RANK" not in os.environ:  # torchrun sets it in every process it starts
        return 0, device
    if device.type == "mps":
        raise UsageError("torchrun cannot use Apple's GPU (mps), as gloo takes CPU tensors only: "
                         "add --device cpu, or run without torchrun to use the GPU")
    if device.type == "cuda":  # one GPU per process: local rank k uses GPU k
        local_rank, count = int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()
        if local_rank >= count:
            raise UsageError(f"local rank {local_rank} has no GPU: this machine has {count} "
                             f"GPU(s); give torchrun --nproc_per_node={count}, or --device cpu")
        torch.cuda.set_device(device := torch.device("cuda", local_rank))
    if sys.platform == "win32":  # PyTorch there lacks libuv, which gloo wants (docs/distributed.md)
        os.environ.setdefault("USE_LIBUV", "0")
    ## Imported before the group exists: its functions take the group as a default argument.
    ## Imported later (the optimizer does), they keep it alive, and its threads abort the exit.
    import torch.distributed.nn as _  # noqa: F401

    dist = torch.distributed
    ## NCCL moves tensors from GPU to GPU (Windows has no NCCL); gloo works on CPU tensors.
    nccl = device.type == "cuda" and sys.platform != "win32"
    ## device_id: this rank's GPU, told once here, or each collective guesses it (and warns).
    dist.init_process_group("nccl" if nccl else "gloo", device_id=device if nccl else None)
    return dist.get_rank(), device


def distributed() -> bool:
    """Whether torchrun started this process among others, and join_torchrun() joined them."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def world_and_rank() -> tuple[int, int]:
    """How many processes train together, and this one's number (its rank): (1, 0) without
    torchrun."""
    dist = torch.distributed
    return (dist.get_world_size(), dist.get_rank()) if distributed() else (1, 0)


def mean_over_processes(value: float, device: torch.device) -> float:
    """The mean of `value` over torchrun's processes (they all call this together)."""
    total = torch.tensor(value, dtype=torch.float64, device=device)  # NCCL: on the GPU
    torch.distributed.all_reduce(total)  # every process's value, added up
    return total.item() / torch.distributed.get_world_size()


def is_main_process() -> bool:
    """True in a plain run and on rank 0, also before the processes have joined."""
    return os.environ.get("RANK", "0") == "0"


def leave_distributed(wait: bool) -> None:
    """Leave torchrun's process group; after the others (`wait`) when the run went well."""
    if distributed():
        if wait:  # a rank that leaves while another still works can bring the whole run down
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def amp_dtype(choice: str | None, device: torch.device) -> torch.dtype | None:
    """--amp as a dtype: bfloat16, which keeps float32's range and needs no GradScaler, where
    the device computes it natively; float16 on older NVIDIA GPUs."""
    if choice == "auto" and device.type == "cuda":  # NVIDIA: native from Ampere (8.0) on; AMD: 9+
        ## Not torch.cuda.is_bf16_supported(): it says True where bfloat16 is only emulated
        ## (T4, V100, RTX 20xx: slower than float32), and about the current GPU, not `device`.
        choice = "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp16"
    if choice == "fp16" and device.type == "mps":  # float16 needs a GradScaler
        raise UsageError("--amp fp16 on mps: float16 needs a GradScaler, which MPS does not "
                         "support reliably; use --amp bf16 (macOS 14 or later)")
    return {"auto": torch.bfloat16, "bf16": torch.bfloat16, "fp16": torch.float16,
            None: None}[choice]  # "auto" left: a CPU, or Apple's or Intel's GPU


def make_deterministic() -> None:
    """--deterministic: forbid the GPU kernels whose sums vary from run to run."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first matmul
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def compile_problem(device: torch.device) -> str | None:
    """Why torch.compile (it writes C++ on the CPU, Triton on NVIDIA GPUs) cannot work, or None."""
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "it needs Triton for NVIDIA GPUs, which is not installed (Windows wheels lack it)"
    ## The compiler torch.compile calls: cl.exe on Windows, else CXX if set, else g++ or clang++
    names = (["cl"] if sys.platform == "win32" else os.environ.get("CXX", "").split()[:1]
             or ["g++", "clang++", "c++"])
    if device.type == "cpu" and not any(map(shutil.which, names)):
        return (f"on the CPU it needs a C++ compiler, and {' or '.join(names)} was not found: "
                "install one (Visual Studio's Build Tools on Windows, Xcode's command line tools "
                "on a Mac), or fix CXX")
    return None


def note_missing_gpu(device: torch.device, asked: str) -> None:
    """Print a note, in the main process, when --device `asked` "auto" got the CPU although an
    NVIDIA driver is installed (nvidia-smi is looked up, never run: running it takes seconds)."""
    if asked != "auto" or device.type != "cpu" or not is_main_process() or shutil.which(
            "nvidia-smi") is None:
        return
    print("note: an NVIDIA driver is installed (nvidia-smi), but this runs on the CPU: " + (
        f"this PyTorch ({torch.__version__}) is a CPU-only build; install the CUDA build from "
        "https://pytorch.org/get-started/locally/" if torch.version.cuda is None else
        f"this PyTorch is built for CUDA {torch.version.cuda}, but it finds no usable GPU: the "
        "driver may be too old for it, or CUDA_VISIBLE_DEVICES hides the GPU"))


def memory_size(device: torch.device) -> int | None:
    """Bytes of memory that `device` has: the GPU's own, or the machine's RAM (None: unknown)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    with contextlib.suppress(AttributeError, ValueError, OSError):  # Windows has no sysconf
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # Apple's GPUs share it
    return None


def check_model_size(args: argparse.Namespace, sizes: dict, device: torch.device) -> None:
    """Refuse (UsageError) model sizes whose training cannot fit in `device`'s memory."""
    ## Built on the "meta" device, a model has shapes but no memory: its size costs nothing.
    with torch.device("meta"):
        weights = sum(p.numel() for p in common.build_model(args.model, **sizes).parameters())
    ## Training holds about 4 float32 copies: the weights, their gradients and Adam's two
    ## averages (SGD keeps one: a little less), and --ema's one more. Activations come on top.
    need, have = 4 * weights * (5 if args.ema else 4), memory_size(device)
    if sizes and have is not None and need > have:
        raise UsageError(f"{' '.join(as_words(args, ('hidden', 'channels')))} makes a model of "
                         f"{weights:,} weights: training it takes {need / 2**30:,.1f} GiB or "
                         f"more, and {'this GPU' if device.type == 'cuda' else 'this machine'} "
                         f"has {have / 2**30:,.1f} GiB; give smaller sizes")
