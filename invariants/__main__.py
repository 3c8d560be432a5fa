import sys

from invariants.cli import main

sys.exit(main())
