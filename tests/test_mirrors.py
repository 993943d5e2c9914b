"""The files made for another language from a Python owner (``shmq.mirrors``): each is
what its owner makes now, each says so on its first line, and no file in shmq/ says it
is generated without being one of them."""

import os
import subprocess
import sys

from shmq import mirrors

PACKAGE = os.path.dirname(os.path.abspath(mirrors.__file__))


def test_every_mirror_is_what_its_owner_makes_now():
    assert mirrors.stale() == [], "stale: run python -m shmq.mirrors"
    for mirror, (module, _function) in mirrors.MIRRORS.items():
        with open(mirrors.path(mirror)) as f:
            assert f.readline().strip() == f"/* {mirrors.banner(module)} */", mirror


def test_no_file_says_it_is_generated_without_being_a_mirror():
    said = set()
    for root, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith((".h", ".c", ".java", ".py")):
                path = os.path.join(root, name)
                with open(path, errors="replace") as f:
                    if "GENERATED" in f.readline():
                        said.add(os.path.relpath(path, PACKAGE).replace(os.sep, "/"))
    assert said == set(mirrors.MIRRORS)


def test_check_names_a_stale_mirror_and_the_writer_mends_it(tmp_path, monkeypatch):
    mirror = "server/_reply_budget.h"
    path = tmp_path / "_reply_budget.h"
    path.write_text("/* old */\n")
    monkeypatch.setattr(mirrors, "path", lambda m: str(path) if m == mirror else os.path.join(PACKAGE, *m.split("/")))
    assert mirrors.stale() == [mirror]
    assert mirrors.write_all() == [mirror]
    assert mirrors.stale() == [] and path.read_text() == mirrors.text(mirror)


def test_the_command_line_check_exits_0_on_the_tree():
    r = subprocess.run([sys.executable, "-m", "shmq.mirrors", "--check"], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (0, "")
