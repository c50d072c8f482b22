"""Entry point: ``python -m roarmq.pipeline ...``, or ``spark-submit ... pipeline/__main__.py ...``.

Imports are absolute so the file also runs as a plain script (spark-submit's primary resource),
with the project on the path through ``--py-files``.
"""

import sys

from roarmq.pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
