"""Packaging and first run: ``python -m shmq``, one place for the version, the files a
package ships with, and no silent fall back to the slow paths."""

import importlib.metadata
import os
import shutil
import subprocess
import sys

import shmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_python_dash_m_shmq_is_the_command_line():
    r = subprocess.run([sys.executable, "-m", "shmq", "--version"], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, f"shmq, version {shmq.__version__}")


def test_the_version_has_one_place():
    assert importlib.metadata.version("shmq") == shmq.__version__


def test_the_package_ships_its_type_marker_and_licence():
    assert os.path.exists(os.path.join(os.path.dirname(shmq.__file__), "py.typed"))
    with open(os.path.join(ROOT, "LICENSE")) as f:
        assert f.readline().strip() == "MIT License"


def _import_without_c(tmp_path, **env):
    tree = tmp_path / "src"
    shutil.copytree(os.path.dirname(shmq.__file__), tree / "shmq",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    return subprocess.run([sys.executable, "-c", "import shmq.engine.shm.cpaths; print(shmq.engine.shm.cpaths.FAST)"], capture_output=True,
                          text=True, timeout=60, cwd=str(tmp_path),
                          env={**os.environ, "PYTHONPATH": str(tree), **env})


def test_a_checkout_without_its_c_paths_says_so_once(tmp_path):
    r = _import_without_c(tmp_path, SHMQ_PURE_PYTHON="")
    assert r.returncode == 0 and r.stdout.strip() == "False"
    assert r.stderr.count("C hot paths are not built") == 1 and "SHMQ_PURE_PYTHON=1" in r.stderr


def test_choosing_the_python_paths_is_silent(tmp_path):
    r = _import_without_c(tmp_path, SHMQ_PURE_PYTHON="1")
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "False", "")
