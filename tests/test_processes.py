"""Subprocesses launched with ``checkout_env`` import this checkout's ``robust_pretrain``, not a copy installed in
the environment."""

import site
import subprocess
import sys

import pytest
from processes import REPO_ROOT, TESTS, checkout_env

PRINT_ORIGINS = "import robust_pretrain, tiny_training; print(robust_pretrain.__file__); print(tiny_training.__file__)"


@pytest.mark.slow
def test_a_subprocess_imports_robust_pretrain_from_the_checkout(tmp_path):
    # an environment with a stale robust_pretrain installed in its site-packages (and this venv's packages behind it)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    packages = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    stale = tmp_path / "venv" / packages.split("/venv/", 1)[1] / "robust_pretrain"
    stale.mkdir(parents=True)
    (stale / "__init__.py").write_text("")
    (stale.parent / "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    def origins(env: dict[str, str], code: str = PRINT_ORIGINS) -> list[str]:
        result = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    # what the tests used to do (PYTHONPATH = tests/ only) imports the installed copy ...
    old_way = checkout_env() | {"PYTHONPATH": str(TESTS)}
    assert origins(old_way, "import robust_pretrain; print(robust_pretrain.__file__)") == [str(stale / "__init__.py")]
    # ... the helper imports the checkout
    assert origins(checkout_env(OMP_NUM_THREADS="1")) == [
        str(REPO_ROOT / "robust_pretrain" / "__init__.py"),
        str(TESTS / "tiny_training.py"),
    ]
