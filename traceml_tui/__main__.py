import sys

from traceml_tui.cli import main

sys.exit(main())
