from loadlab.cli import main

main()
