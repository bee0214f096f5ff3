"""Build hook: ship the top-level policies/ and config.example.yaml inside the package, as proxy/data/.

The top-level copies stay the source of truth (the README, the tests and users name them); a wheel
carries them so that a plain `pip install .` finds them (see proxy/shipped.py).
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's copies in place
        data = Path(self.build_lib) / "proxy" / "data"
        data.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / "config.example.yaml", data / "config.example.yaml")
        # The whole folder: a policy may pin files that sit beside it (pinned.files).
        shutil.copytree(ROOT / "policies", data / "policies", dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithData})
