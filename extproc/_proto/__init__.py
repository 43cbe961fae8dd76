"""Code generated from ``protos/`` at install time (see setup.py); not checked in."""
