"""The `milkit` command of the wheel: the same command line as the Rust binary, run by the
extension in this process."""

import sys


def main():
    from milkit._milkit import cli_main

    sys.stdout.flush()
    sys.exit(cli_main(["milkit", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
