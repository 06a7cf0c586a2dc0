"""`dlio_ckpt-describe-model`: a saved checkpoint's tensor list -> a workload's explicit model section."""
