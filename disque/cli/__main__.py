from disque.cli.main import main

main()
