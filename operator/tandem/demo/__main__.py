"""`python -m tandem.demo`."""

import sys

from tandem.demo.main import main

sys.exit(main())
