"""python3 -m calc EXPR"""
import sys

from . import CalcError, evaluate, format_result


def main(argv):
    raise NotImplementedError


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
