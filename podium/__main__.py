import sys

from podium.cli import main

sys.exit(main())
