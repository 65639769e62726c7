"""`python -m kvlab` runs the same CLI as the `kvlab` console script."""

from kvlab.cli import main

if __name__ == "__main__":  # the proxy's workers import this module again (spawn)
    main()
