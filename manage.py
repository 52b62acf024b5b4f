#!/usr/bin/env python
"""Django's command-line utility; ``llmgw`` does the same and more."""

import sys

from llmgw.cli import django_main

if __name__ == "__main__":
    sys.exit(django_main(sys.argv[1:]))
