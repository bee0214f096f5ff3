"""Files shipped with ctxproxy: the policies and the example config.

An installed wheel carries them as package data in `proxy/data/` (setup.py copies them there at build
time); a source checkout or an editable install reads the repository's top-level copies, which are the
source of truth.
"""

from __future__ import annotations

import shutil
from pathlib import Path

PACKAGE_DATA = Path(__file__).resolve().parent / "data"
_SOURCE_ROOT = Path(__file__).resolve().parent.parent

EXAMPLE_CONFIG = "config.example.yaml"
POLICIES = "policies"


def shipped(relative: str) -> Path | None:
    """The shipped file or folder `relative` (e.g. "policies"), or None when this install has none."""
    packaged = PACKAGE_DATA / relative
    if packaged.exists():
        return packaged
    # Only a checkout counts as the source: site-packages/policies could belong to anyone.
    if (_SOURCE_ROOT / "pyproject.toml").is_file() and (_SOURCE_ROOT / relative).exists():
        return _SOURCE_ROOT / relative
    return None


def policies_dir() -> Path | None:
    """Where the shipped policies are; used when the config sets no policies_dir."""
    return shipped(POLICIES)


def init(folder: Path) -> list[str]:
    """Write `config.yaml` and `policies/*.yaml` into `folder` from the shipped copies; never overwrite.

    The example config's `policies_dir: ./policies` and `data_dir: ./data` are relative to its own
    folder, so the result runs as it is: `ctxproxy serve --config FOLDER/config.yaml`.
    """
    example, policies = shipped(EXAMPLE_CONFIG), shipped(POLICIES)
    if example is None or policies is None:
        raise FileNotFoundError("this ctxproxy install ships no example config or policies")
    pairs = [(example, folder / "config.yaml")]
    pairs += [(source, folder / POLICIES / source.name) for source in sorted(policies.glob("*.yaml"))]
    report = []
    for source, target in pairs:
        if target.exists():
            report.append(f"kept {target} (already there)")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        report.append(f"wrote {target}")
    return report
