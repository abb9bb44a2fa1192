"""Kernels that reach into torch's private APIs, fenced here so a torch upgrade has one place to
check: README.md lists every private API used, where, and what breaks if it changes. Private to
`raymm.training`: nothing outside it imports from here.
"""
