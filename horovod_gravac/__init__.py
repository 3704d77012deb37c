"""GraVAC adaptive gradient compression for Horovod."""
