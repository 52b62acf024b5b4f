"""What the fleet is: nodes, GPUs and MIG instances, NVLink domains, IMEX, InfiniBand ports."""
