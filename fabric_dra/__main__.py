import sys

from fabric_dra.cli import main

sys.exit(main())
