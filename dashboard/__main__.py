"""python -m kvscope.dashboard [--host H] [--port P] [--backend-url URL]: run the dashboard."""

import argparse
import sys

from kvscope.dashboard.launch import run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kvscope.dashboard", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    parser.add_argument(
        "--backend-url", help="backend to read (default KVSCOPE_BACKEND_URL or 127.0.0.1:4318)"
    )
    arguments = parser.parse_args()
    sys.exit(run(arguments.host, arguments.port, arguments.backend_url))


if __name__ == "__main__":
    main()
