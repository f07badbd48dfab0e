import sys

from smlt.cli import main

sys.exit(main())
