"""Which CUDA build of torch a node's NVIDIA driver can run. Standard library only:
scripts/bootstrap.sh runs this file with the system Python before the venv exists, and the
job's device check (jobs/training/devices.py) names the same minimum drivers.

    python3 jobs/cuda_builds.py            # the build for this node: cu130, cu128 or cu126
    python3 jobs/cuda_builds.py 550.54.15  # the build for that driver version

SCALELAB_CUDA=cuNNN chooses the build explicitly. Without a driver (a login node, where
`nvidia-smi` is missing) the answer is DEFAULT_BUILD.

Minimum drivers, from NVIDIA's CUDA Toolkit release notes (table "CUDA Toolkit and
Corresponding Driver Versions", and "CUDA minor version compatibility"): CUDA 13.x needs
>= 580; a CUDA 12.x runtime runs on >= 525.60.13 through minor version compatibility, and
natively on the driver its toolkit shipped with (12.8: 570.26, 12.6: 560.28). Each build
is chosen where its native driver is there, cu126 down to the CUDA 12 minimum.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

# newest first: (PyTorch index build, the oldest driver it is chosen for)
BUILDS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("cu130", (580, 0)),
    ("cu128", (570, 26)),
    ("cu126", (525, 60)),
)
DEFAULT_BUILD = "cu128"  # no driver to ask: runs on any CUDA 12 driver, Hopper and Blackwell
MIN_DRIVER = {13: (580, 0), 12: (525, 60)}  # by CUDA major version
BUILD_NAME = re.compile(r"cu\d{3}")


def parse_driver(text: str) -> tuple[int, ...]:
    """'550.54.15' -> (550, 54, 15); ValueError for anything else."""
    text = text.strip()
    if not re.fullmatch(r"\d+(\.\d+)*", text):
        raise ValueError(f"not an NVIDIA driver version: {text!r}")
    return tuple(int(p) for p in text.split("."))


def show(version: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in version)


def choose_build(driver: str) -> str:
    """The newest build the driver runs; ValueError when it is older than CUDA 12 needs."""
    version = parse_driver(driver)
    for build, oldest in BUILDS:
        if version >= oldest:
            return build
    raise ValueError(
        f"NVIDIA driver {driver.strip()} is too old for torch's CUDA builds (CUDA 12 needs "
        f">= {show(MIN_DRIVER[12])}); ask for a newer driver, or use SCALELAB_TORCH=cpu"
    )


def min_driver(cuda_version: str) -> tuple[int, ...] | None:
    """The oldest driver a CUDA runtime ('12.8', torch.version.cuda) loads on; None if unknown."""
    major = cuda_version.split(".", 1)[0]
    return MIN_DRIVER.get(int(major)) if major.isdigit() else None


def driver_version() -> str | None:
    """The driver `nvidia-smi` reports (first GPU); None where it is missing or fails."""
    try:
        shown = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = shown.stdout.strip().splitlines()
    return lines[0].strip() if shown.returncode == 0 and lines else None


def main(argv: list[str]) -> int:
    chosen = os.environ.get("SCALELAB_CUDA", "").strip()
    if chosen:
        if not BUILD_NAME.fullmatch(chosen):
            print(
                f"SCALELAB_CUDA must name a build such as cu128 (got {chosen!r})", file=sys.stderr
            )
            return 2
        print(chosen)
        return 0
    driver = argv[0] if argv else driver_version()
    if driver is None:
        print(
            f"no NVIDIA driver answers here (nvidia-smi): CUDA build {DEFAULT_BUILD}; set "
            "SCALELAB_CUDA to the build the compute nodes' driver needs",
            file=sys.stderr,
        )
        print(DEFAULT_BUILD)
        return 0
    try:
        print(choose_build(driver))
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
