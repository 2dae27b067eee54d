"""rlmesh's framework: one folder each for its commands, config, the loop, the algorithms, the trainer's inside,
sample packing, weights, checkpoints, processes, services and metrics; the modules directly here are the ground floor
they share (the console's warnings and status lines, name resolution, offline assets, GPUs, precision). The floors are asserted by tests/test_layout.py.

Kept empty of imports: importing a subpackage must not import its siblings."""
