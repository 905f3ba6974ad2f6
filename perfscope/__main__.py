import sys

from perfscope.cli import main

sys.exit(main())
