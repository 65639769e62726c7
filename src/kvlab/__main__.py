"""`python -m kvlab` runs the same CLI as the `kvlab` console script."""

from kvlab.cli import main

main()
