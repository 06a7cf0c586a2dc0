"""`dlio_ckpt-profile`: from the Darshan logs of a real training program to a dlio_ckpt workload."""
