"""Trainer to generators: publishing and loading policy weights by version, and torchstore compatibility.

Kept empty of imports: importing a subpackage must not import its siblings."""
