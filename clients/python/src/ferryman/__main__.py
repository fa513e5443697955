from ferryman.cli import main

main()
