"""python -m kvscope.backend [--host H] [--port P]: run the backend."""

import argparse

from kvscope.backend.server import run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kvscope.backend", description=__doc__)
    parser.add_argument(
        "--host",
        help="address to bind (default KVSCOPE_BACKEND_HOST or "
        "127.0.0.1; other than loopback needs a token)",
    )
    parser.add_argument("--port", type=int, help="port (default KVSCOPE_BACKEND_PORT or 4318)")
    parser.add_argument(
        "--grpc-port",
        type=int,
        help="OTLP/gRPC port (default KVSCOPE_BACKEND_GRPC_PORT or 4317; 0: none)",
    )
    parser.add_argument("--log-level", help="uvicorn log level (default info)")
    arguments = parser.parse_args()
    run(
        arguments.host, arguments.port, log_level=arguments.log_level, grpc_port=arguments.grpc_port
    )


if __name__ == "__main__":
    main()
