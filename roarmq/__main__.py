"""`python -m roarmq [options]`: the broker, as `roarmq serve [options]`.

`python -m roarmq SUBCOMMAND ...` takes the `roarmq` script's subcommands too.
"""

import sys

from roarmq.broker.__main__ import SUBCOMMANDS, cli, main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv and argv[0] in SUBCOMMANDS:
        sys.exit(cli(argv))
    sys.exit(main(argv, prog="python -m roarmq"))
