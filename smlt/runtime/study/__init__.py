"""Hyper-parameter studies: many ordinary runs under one budget and deadline (issue #15)."""
