import sys

from quickdraft.bench.phases.cli import main

sys.exit(main())
