"""The acceptance kit: a folder of pinned wheels that makes scripts/gpu-acceptance.sh run on
an offline GPU node whose own Python lacks scalelab's lighter dependencies.

    python -m benchmarks.acceptance.kit manifest DIR --python-version 3.12 NAME==VER ...
    python -m benchmarks.acceptance.kit install DIR TARGET

`manifest` (scripts/gpu-kit.sh, where the index is reachable) checks that DIR holds one
wheel per pin at the pinned version, for the target Python, and writes DIR/kit.json.
`install` (gpu-acceptance.sh, on the node) installs into TARGET, with `pip --no-index
--no-deps --target`, each wheel whose distribution this interpreter lacks or holds at an
older version, after checking its sha256; the node's own packages stay in charge of
everything else. Standard library only: it runs before anything else can be imported.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

MANIFEST = "kit.json"
TREE_LIMIT_BYTES = 64 * 2**20  # what a working tree copied to the node may weigh in all
_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-")


@dataclass(frozen=True)
class Wheel:
    name: str  # normalised distribution name
    version: str
    file: str
    sha256: str
    bytes: int
    python: str  # the wheel's python tag: py3, cp312, ...


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def version_key(version: str) -> tuple:
    """A release's numeric parts, enough to order the pinned releases (no pre-releases)."""
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+]", version)[:4])


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_wheel(path: Path) -> Wheel:
    m = _WHEEL.match(path.name)
    if not m:
        raise ValueError(f"{path.name} is not a wheel file name")
    return Wheel(normalise(m["name"]), m["version"], path.name, sha256(path),
                 path.stat().st_size, m["py"])  # fmt: skip


def manifest(folder: Path, python_version: str, pins: list[str]) -> list[Wheel]:
    """Check DIR against the pins and write kit.json; raises naming every problem."""
    wheels = {w.name: w for w in map(read_wheel, sorted(folder.glob("*.whl")))}
    problems = []
    for pin in pins:
        name, _, version = pin.partition("==")
        got = wheels.get(normalise(name))
        if got is None:
            problems.append(f"{pin}: no wheel in {folder}")
        elif got.version != version:
            problems.append(f"{pin}: the wheel is {got.file}")
    extra = set(wheels) - {normalise(p.partition("==")[0]) for p in pins}
    problems += [f"{wheels[n].file}: not pinned" for n in sorted(extra)]
    total = sum(w.bytes for w in wheels.values())
    if total > TREE_LIMIT_BYTES // 4:  # the tree and its build outputs share the rest
        problems.append(f"the kit weighs {total / 2**20:.1f} MiB, over a quarter of 64 MiB")
    if problems:
        raise SystemExit("gpu-kit: " + "; ".join(problems))
    listing = sorted(wheels.values(), key=lambda w: w.name)
    body = {"python": python_version, "wheels": [asdict(w) for w in listing]}
    (folder / MANIFEST).write_text(json.dumps(body, indent=2) + "\n")
    print(f"==> {folder}: {len(listing)} wheels, {total / 2**20:.1f} MiB, for CPython "
          f"{python_version}: " + ", ".join(f"{w.name} {w.version}" for w in listing))  # fmt: skip
    return listing


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def plan_install(folder: Path) -> tuple[list[Wheel], list[str]]:
    """The kit's wheels this interpreter needs, and a word on each one it does not."""
    body = json.loads((folder / MANIFEST).read_text())
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    needed, kept = [], []
    for w in (Wheel(**raw) for raw in body["wheels"]):
        have = installed_version(w.name)
        if have is not None and version_key(have) >= version_key(w.version):
            kept.append(f"{w.name} {have}")
            continue
        if w.python.startswith("cp") and w.python != here:
            raise SystemExit(
                f"kit: {w.file} is for {w.python}, this Python is {here}: build the kit with "
                f"scripts/gpu-kit.sh --python-version {sys.version_info.major}."
                f"{sys.version_info.minor}"
            )
        if sha256(folder / w.file) != w.sha256:
            raise SystemExit(f"kit: {w.file} does not match its sha256 in {MANIFEST}")
        needed.append(w)
    return needed, kept


def install(folder: Path, target: Path) -> None:
    needed, kept = plan_install(folder)
    target.mkdir(parents=True, exist_ok=True)
    if needed:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
               "--disable-pip-version-check", "--target", str(target),
               *(str(folder / w.file) for w in needed)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"kit: pip could not install the kit: {proc.stderr.strip()[-500:]}")
    print("kit: installed " + (", ".join(f"{w.name} {w.version}" for w in needed) or "nothing")
          + f" into {target}; this Python already had " + (", ".join(kept) or "none of it"),
          flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("manifest", help="check a downloaded kit and write kit.json")
    make.add_argument("folder", type=Path)
    make.add_argument("--python-version", required=True)
    make.add_argument("pins", nargs="+")
    put = sub.add_parser("install", help="install what this Python lacks into TARGET")
    put.add_argument("folder", type=Path)
    put.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    if args.command == "manifest":
        manifest(args.folder, args.python_version, args.pins)
    else:
        install(args.folder, args.target)


if __name__ == "__main__":
    main()
