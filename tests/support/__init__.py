"""Tools the tests share across their folders, one module per tool (a filesystem, a network,
a cluster): each module's docstring says what it builds and how a test uses it."""
