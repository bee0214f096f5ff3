"""A plain (non-editable) install carries the shipped policies and example config, and uses them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import proxy
from proxy.cli import main
from proxy.config import load_config
from proxy.policy import PolicyStore

ROOT = Path(__file__).parent.parent
# What the Dockerfile copies into its build stage too.
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "config.example.yaml", "policies",
           "proxy")
SHIPPED_POLICIES = sorted(p.name for p in (ROOT / "policies").glob("*.yaml"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy: pip builds in the source tree (build/, *.egg-info), which others are editing.
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-index", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(out), str(source)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [built] = out.glob("ctxproxy-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel unpacked as site-packages would hold it."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def run(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Python with the unpacked wheel first on the path and neither the checkout nor its cwd."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=env)


def test_wheel_carries_the_policies_and_the_example_config_byte_for_byte(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert archive.read("proxy/data/config.example.yaml") == (ROOT / "config.example.yaml").read_bytes()
        for name in SHIPPED_POLICIES:
            assert archive.read(f"proxy/data/policies/{name}") == (ROOT / "policies" / name).read_bytes()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "ctxproxy = proxy.cli:main" in archive.read(entry_points).decode()
    assert {"default.yaml", "coding-agent.yaml"} <= set(SHIPPED_POLICIES)
    assert not any(name.startswith(("policies/", "tests/")) for name in names)  # nothing outside proxy/


def test_installed_package_finds_its_own_policies_without_the_checkout(installed, tmp_path):
    probe = ("import json, proxy; from proxy.policy import PolicyStore; store = PolicyStore(None); "
             "print(json.dumps({'module': proxy.__file__, 'folder': str(store.folder), "
             "'names': store.names(), 'default': str(store.get('default').path), "
             "'coding': store.get('coding-agent').policy.model_dump(mode='json')}))")
    done = run(installed, "-c", probe, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert Path(seen["module"]).is_relative_to(installed)
    assert seen["folder"] == str(installed / "proxy" / "data" / "policies")
    assert seen["names"] == sorted(Path(name).stem for name in SHIPPED_POLICIES)
    assert seen["default"] == str(installed / "proxy" / "data" / "policies" / "default.yaml")
    assert seen["coding"] == PolicyStore(ROOT / "policies").get("coding-agent").policy.model_dump(mode="json")

    policies = sorted(str(p) for p in (installed / "proxy" / "data" / "policies").glob("*.yaml"))
    checked = run(installed, "-m", "proxy", "policy", "check", *policies, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.count(": ok") == len(SHIPPED_POLICIES)


def test_installed_version_and_init(installed, tmp_path):
    # One version, proxy/__init__.py's: pyproject.toml reads it there, the distribution's metadata says it
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dynamic"] == ["version"]
    done = run(installed, "-m", "proxy", "--version", cwd=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, f"ctxproxy {proxy.__version__}")
    done = run(installed, "-c", "import importlib.metadata as m; print(m.version('ctxproxy'))", cwd=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, proxy.__version__)

    done = run(installed, "-m", "proxy", "init", "site-config", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = tmp_path / "site-config"
    assert (written / "config.yaml").read_bytes() == (ROOT / "config.example.yaml").read_bytes()
    assert sorted(p.name for p in (written / "policies").iterdir()) == SHIPPED_POLICIES


def test_source_checkout_uses_the_top_level_policies():
    # An editable install (and ./scripts/ctxproxy) has no proxy/data/: the repository's files are used.
    assert not (ROOT / "proxy" / "data").exists()
    assert PolicyStore(None).folder == ROOT / "policies"


def test_init_writes_a_config_that_runs_as_is_and_never_overwrites(tmp_path, capsys):
    assert main(["init", str(tmp_path)]) == 0
    assert f"wrote {tmp_path / 'config.yaml'}" in capsys.readouterr().out
    config = load_config(tmp_path / "config.yaml")
    assert config.policies_dir == tmp_path / "policies" and config.data_dir == tmp_path / "data"
    assert PolicyStore(config.policies_dir).check_all() == []

    mine = tmp_path / "policies" / "default.yaml"
    mine.write_text("window: {max_tokens: 9000}\n")
    assert main(["init", str(tmp_path)]) == 0
    assert f"kept {mine} (already there)" in capsys.readouterr().out
    assert mine.read_text() == "window: {max_tokens: 9000}\n"
