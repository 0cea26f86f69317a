"""tensorsmith.rewrites"""
