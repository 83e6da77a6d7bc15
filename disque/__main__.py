from disque.cli import server_main

server_main()
