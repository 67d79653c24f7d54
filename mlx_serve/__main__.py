"""`python -m mlx_serve`: the `mlx-serve` command."""

from mlx_serve.server.cli import main

if __name__ == "__main__":
    main()
