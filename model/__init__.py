"""The protocol's Promela model (protocol.pml) and its SPIN driver (check.py): docs/protocol.md."""
