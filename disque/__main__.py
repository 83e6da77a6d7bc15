from disque.cli.server import server_main

server_main()
