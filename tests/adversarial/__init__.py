"""Payloads of a security review, each against the real component it attacks."""
