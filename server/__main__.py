from mlx_serve.server.cli import main

main()
