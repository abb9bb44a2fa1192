"""mylab: an example of research code that plugs into raymm (docs/extending.md).

Importing `mylab.fl` registers everything; nothing is registered by importing `mylab` alone.
"""
