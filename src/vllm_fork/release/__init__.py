"""Release work over every base: the tree venvs, ``release-check`` and ``update``."""
