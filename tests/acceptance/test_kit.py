"""The acceptance kit (benchmarks/acceptance/kit.py): a kit that does not match its pins is
refused before it is shipped; on the node, only what the Python lacks or holds older is
installed, a wheel whose bytes changed or that was built for another Python is refused."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks.acceptance import kit

HERE = f"cp{sys.version_info.major}{sys.version_info.minor}"


def wheel(folder: Path, name: str, version: str, tag: str = "py3-none-any") -> Path:
    """A minimal installable wheel of one module, `name`, holding VERSION."""
    dist = f"{name}-{version}"
    path = folder / f"{dist}-{tag}.whl"
    info = f"{dist}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.py", f"VERSION = {version!r}\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def test_a_kit_that_does_not_match_its_pins_is_refused(tmp_path: Path) -> None:
    wheel(tmp_path, "kitone", "1.0")
    wheel(tmp_path, "kittwo", "2.0")
    with pytest.raises(SystemExit, match="kittwo==2.1: the wheel is kittwo-2.0"):
        kit.manifest(tmp_path, "3.12", ["kitone==1.0", "kittwo==2.1"])
    with pytest.raises(
        SystemExit, match="kitthree==1: no wheel.*kittwo-2.0-py3-none-any.whl: not pinned"
    ):
        kit.manifest(tmp_path, "3.12", ["kitone==1.0", "kitthree==1"])
    assert not (tmp_path / kit.MANIFEST).exists()
    listing = kit.manifest(tmp_path, "3.12", ["kitone==1.0", "kittwo==2.0"])
    assert [(w.name, w.version) for w in listing] == [("kitone", "1.0"), ("kittwo", "2.0")]
    assert json.loads((tmp_path / kit.MANIFEST).read_text())["python"] == "3.12"


def test_the_node_installs_only_what_its_python_lacks_or_holds_older(tmp_path: Path) -> None:
    folder = tmp_path / "kit"
    folder.mkdir()
    pytest_version = subprocess.run(
        [sys.executable, "-c", "import pytest; print(pytest.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    wheel(folder, "kitone", "1.0")
    wheel(folder, "pytest", "1.0")  # older than the one here: kept out
    kit.manifest(folder, "3.x", ["kitone==1.0", "pytest==1.0"])
    target = tmp_path / "site"
    kit.install(folder, target)
    assert (target / "kitone.py").exists() and not (target / "pytest.py").exists()
    probe = "import kitone, pytest; print(kitone.VERSION, pytest.__version__)"
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(target)}).stdout.split()  # fmt: skip
    assert got == ["1.0", pytest_version]


def test_a_changed_wheel_or_one_for_another_python_is_refused(tmp_path: Path) -> None:
    other = "cp39" if HERE != "cp39" else "cp310"
    wheel(tmp_path, "kitone", "1.0")
    wheel(tmp_path, "kitnative", "1.0", f"{other}-{other}-manylinux_2_17_x86_64")
    kit.manifest(tmp_path, "3.9", ["kitone==1.0", "kitnative==1.0"])
    with pytest.raises(
        SystemExit, match=f"kitnative-1.0-{other}.*is for {other}, this Python is {HERE}"
    ):
        kit.plan_install(tmp_path)
    (tmp_path / f"kitnative-1.0-{other}-{other}-manylinux_2_17_x86_64.whl").unlink()
    body = json.loads((tmp_path / kit.MANIFEST).read_text())
    body["wheels"] = [w for w in body["wheels"] if w["name"] == "kitone"]
    (tmp_path / kit.MANIFEST).write_text(json.dumps(body))
    with (tmp_path / "kitone-1.0-py3-none-any.whl").open("ab") as f:
        f.write(b"tampered")
    with pytest.raises(SystemExit, match="kitone-1.0-py3-none-any.whl does not match its sha256"):
        kit.plan_install(tmp_path)
