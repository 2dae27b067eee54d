"""A cluster on one machine: namespaced hosts (their own network, hostname, /tmp and /dev/shm), rlmesh workers on
them and a real Slurm across them; the multi-host tests and benchmarks run on it."""
