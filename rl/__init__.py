"""rlmesh's framework: the run's CLI (`cli.py`) and, one folder each, its config, the loop, the algorithms, the
trainer's inside, sample packing, weights, checkpoints, processes, services, metrics and the console (warnings and
status lines to the user); the modules directly here are the ground floor they share (the config sections' base, name
resolution, offline assets, precision, the vLLM engine loop). The floors are asserted by tests/test_layout.py.

Kept empty of imports: importing a subpackage must not import its siblings."""
