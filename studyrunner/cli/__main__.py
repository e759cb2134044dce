"""`python -m studyrunner.cli`."""

from . import main

main()
