"""sqlite-utils without numpy (proxy/sqlite_lib.py): a leaner start, numpy still there for anyone else."""

from __future__ import annotations

import importlib
import subprocess
import sys

PROBE = """
import sys
import proxy.archive, proxy.reader  # what the server imports: the writer, the reader, the migrations
print("numpy" in sys.modules, "pandas" in sys.modules)
import numpy  # hidden only while sqlite-utils loaded
print(numpy.__name__)
"""


def test_the_archive_modules_load_sqlite_utils_without_numpy_and_leave_it_importable():
    # (numpy comes with litellm[proxy], through soundfile: installed wherever ctxproxy is)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "numpy"]
    assert importlib.import_module("numpy").__name__ == "numpy"  # here too, after the tests' imports


def test_sqlite_utils_works_as_usual():
    from proxy.sqlite_lib import Database

    db = Database(memory=True)
    db["t"].insert_all([{"id": 1, "v": "a"}, {"id": 2, "v": "b"}], pk="id")
    assert [row["v"] for row in db["t"].rows] == ["a", "b"]
