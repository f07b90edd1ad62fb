"""The wheels that travel to the GPU machine, and the travelling size (used by scripts/gpu_prepare.sh).

    python scripts/gpucheck/wheels.py select FULL_DIR .whl   # copy the needed subset of a downloaded closure
    python scripts/gpucheck/wheels.py check .whl             # one version each; every need met there
    python scripts/gpucheck/wheels.py size ROOT .whl .gpu-data  # what travels, in MiB (limit 64)

The device image's packages are ``device_packages.txt`` (from the device's KINDS.md). A wheel of
a package the image has stays behind, except those in :data:`CARRY_ANYWAY` (flwr's generated code
checks the grpcio and protobuf versions at import, and flwr pins typer below 0.21).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIMIT_MIB = 64.0
#: on the device image, but carried: version-checked at import (grpcio, protobuf) or pinned by flwr
CARRY_ANYWAY = frozenset({"grpcio", "protobuf", "typer", "click"})
#: needed by nothing that runs there (flwr's runtime dependency installer is disabled), or on the image
#: and too large to carry
LEAVE_BEHIND = frozenset({"uv", "numpy"})
#: the environment of the device's python3 (Python 3.12.3 on x86-64 Linux) for requirement markers
DEVICE_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


def normalize(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def device_packages(path: Path = HERE / "device_packages.txt") -> set[str]:
    lines = path.read_text().splitlines()
    return {normalize(s.strip()) for s in lines if s.strip() and not s.startswith("#")}


def wheel_name(path: Path) -> tuple[str, str]:
    """(normalised project name, version) from a wheel's file name."""
    parts = path.name[: -len(".whl")].split("-")
    if len(parts) < 5:
        raise ValueError(f"not a wheel file name: {path.name}")
    return normalize(parts[0]), parts[1]


def requires(path: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode("utf-8", "replace"))
    return msg.get_all("Requires-Dist") or []


def select(full: Path, dest: Path, device: set[str] | None = None) -> list[Path]:
    """Copy the wheels of ``full`` that must travel into ``dest``; returns the copies."""
    device = device_packages() if device is None else device
    out = []
    for whl in sorted(full.glob("*.whl")):
        name, _ = wheel_name(whl)
        if name in LEAVE_BEHIND or (name in device and name not in CARRY_ANYWAY):
            continue
        out.append(Path(shutil.copy2(whl, dest / whl.name)))
    return out


def check(dest: Path, device: set[str] | None = None) -> list[str]:
    """Problems of a wheel folder: two versions of one project, or a need that neither a carried
    wheel nor the device image meets (markers evaluated for the device's Python 3.12)."""
    from packaging.requirements import Requirement

    device = device_packages() if device is None else device
    wheels = sorted(dest.glob("*.whl"))
    seen: dict[str, list[str]] = {}
    for whl in wheels:
        name, version = wheel_name(whl)
        seen.setdefault(name, []).append(version)
    problems = [f"{n}: {len(v)} versions {v} (keep one)" for n, v in seen.items() if len(v) > 1]
    for whl in wheels:
        for line in requires(whl):
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(DEVICE_ENV):
                continue
            dep = normalize(req.name)
            if dep in seen:
                if not any(req.specifier.contains(v, prereleases=True) for v in seen[dep]):
                    problems.append(f"{whl.name} needs {line}; carried: {dep} {seen[dep]}")
            elif dep not in device and dep not in LEAVE_BEHIND:
                problems.append(f"{whl.name} needs {req.name}, neither carried nor on the device image")
    return problems


def travelling_files(root: Path) -> list[Path]:
    """The repo's files that travel: tracked and untracked-not-ignored (``git ls-files -co --exclude-standard``)."""
    res = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True, check=True
    )
    return [root / p for p in res.stdout.decode().split("\0") if p and (root / p).is_file()]


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def size_report(root: Path, carried: list[str]) -> tuple[str, float]:
    """One line per part and the total in MiB."""
    repo = sum(p.stat().st_size for p in travelling_files(root)) / 2**20
    parts = [("repository (tracked + untracked, not ignored)", repo)]
    parts += [(f"{c}/ (carried)", tree_bytes(root / c) / 2**20) for c in carried]
    total = sum(v for _, v in parts)
    lines = [f"  {what:<48} {mib:7.2f} MiB" for what, mib in parts]
    lines.append(f"  {'travelling in all (limit 64 MiB)':<48} {total:7.2f} MiB")
    return "\n".join(lines), total


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "select":
        copied = select(Path(argv[1]), Path(argv[2]))
        print(f"wheels: {len(copied)} copied to {argv[2]}")
        return 0
    if len(argv) == 2 and argv[0] == "check":
        problems = check(Path(argv[1]))
        for p in problems:
            print(f"wheels: PROBLEM {p}")
        n = len(list(Path(argv[1]).glob("*.whl")))
        print(f"wheels: {n} in {argv[1]}, {tree_bytes(Path(argv[1])) / 2**20:.1f} MiB, {len(problems)} problem(s)")
        return 1 if problems else 0
    if len(argv) >= 2 and argv[0] == "size":
        text, total = size_report(Path(argv[1]), argv[2:])
        print("travelling size:\n" + text)
        if total > LIMIT_MIB:
            print(f"travelling size: OVER the {LIMIT_MIB:.0f} MiB limit")
            return 1
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
