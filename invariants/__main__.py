import sys

from mlx_invariants.cli import main

sys.exit(main())
