"""`python -m precaudit` runs the command line."""

from .cli import main

main()
