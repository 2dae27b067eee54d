"""Payloads of the security review (issue 19), each against the real component it attacks."""
