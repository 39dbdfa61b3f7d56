"""Every chapter runs outside the repository, with only the package installed from its wheel.

The wheel is built from this checkout and installed into a folder of its own (`pip install
--target`, nothing editable); its dependencies are this environment's. Each chapter, as the
website offers it for download, is copied into an empty temporary folder and run there under
strict nbval: every output must equal the committed one. So a chapter reads only what the
package ships (grpo_edu/book/home.py), writes its runs under the folder it runs in, and prints
nothing that depends on where it runs.

The tier is marked `anywhere`: `make test-anywhere` runs it (CI does), `make test` does not.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_edu import book as bookmod
from grpo_edu.book import html as site

ROOT = Path(__file__).resolve().parents[1]
BOOK = bookmod.load_book(ROOT)
pytestmark = pytest.mark.anywhere


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from this checkout, installed into a folder of its own."""
    root = tmp_path_factory.mktemp("wheel")
    # Built as pip builds it for a reader: in an isolated environment with pyproject.toml's
    # build requirements (this venv's own setuptools may be older than bdist_wheel needs).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(root / "dist"), str(ROOT)], check=True, cwd=root)
    wheel, = (root / "dist").glob("grpo_edu-*.whl")
    target = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, cwd=root)
    return target


def _env(installed):
    env = bookmod.kernel_env()
    env["PYTHONPATH"] = str(installed)
    env.pop("PYTHONSTARTUP", None)
    return env


def test_the_installed_package_is_the_wheels_and_knows_it_is_outside_the_repository(installed, tmp_path):
    probe = ("import grpo_edu, json; from grpo_edu.book import home; "
             "from grpo_edu.config import DEFAULT_CONFIG; "
             "print(json.dumps([grpo_edu.__file__, home.in_repository(), str(home.path('configs/cpu-tiny.toml')), "
             "str(DEFAULT_CONFIG)]))")
    out = subprocess.run([sys.executable, "-c", probe], env=_env(installed), cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    where, in_repository, config, default = json.loads(out)
    assert Path(where).is_relative_to(installed) and not in_repository
    assert Path(config).is_relative_to(installed) and Path(config).is_file() and default == config


def test_every_chapter_runs_in_a_folder_of_its_own_and_prints_the_committed_outputs(installed, tmp_path):
    folder = tmp_path / "reader"
    folder.mkdir()
    for chapter in BOOK.chapters:
        (folder / chapter.path.name).write_text(site.downloadable(ROOT / chapter.path))
    shutil.copyfile(ROOT / "chapters" / "conftest.py", folder / "conftest.py")
    workers = os.environ.get("TEST_WORKERS", "2")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers, "--dist", "loadfile",
         "--nbval", "--nbval-current-env", "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg"),
         "--rootdir", str(folder), *sorted(str(p) for p in folder.glob("*.ipynb"))],
        env=_env(installed), cwd=folder, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert not (folder / "configs").exists()           # nothing was read from beside the notebooks
