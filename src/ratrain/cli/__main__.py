from ratrain.cli import main

main()
