"""`python -m scalelab ...` is the `scalelab` command."""

from scalelab.cli.main import main

main()
