"""Diagnostics: what the device did."""
