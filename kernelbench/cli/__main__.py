from kernelbench.cli.commands import main

main()
