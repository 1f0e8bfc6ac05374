import sys

from quickdraft.cli import main

if __name__ == "__main__":
    sys.exit(main())
