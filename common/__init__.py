"""Small utilities every stage uses: dotlist CLIs, file I/O, checksums.

Stages never import each other's internals; they may all import `common`.
"""
