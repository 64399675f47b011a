import sys

from fuzz.runner import main

sys.exit(main())
