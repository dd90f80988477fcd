import sys

from fastnf4.cli import main

sys.exit(main())
