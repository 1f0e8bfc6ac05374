import sys

from quickdraft.lsp_bridge.cli import main

sys.exit(main())
