from shardlab.cli import main

main()
