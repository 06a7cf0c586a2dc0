"""Toy dlio_ckpt plugins: each module is one extension, registered by one entry point."""
