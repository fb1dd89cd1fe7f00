"""Greets people."""
