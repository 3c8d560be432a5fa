"""A fresh venv that borrows this venv's dependencies but none of its projects.

`python -m venv --without-pip`, plus one `.pth` line naming this venv's
site-packages: MLX, mlx-lm, pytest and the rest import there without a second
download. A folder named in a `.pth` file is only appended to the path, so this
venv's editable install of mlx-invariants (itself a `.pth` hook) does not run:
the fresh venv cannot import `mlx_invariants` until something installs it.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def borrowing_venv(folder: Path) -> tuple[Path, Path]:
    """Create the venv in `folder`; return its python and its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, site
