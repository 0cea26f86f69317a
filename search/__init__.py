"""tensorsmith.search"""
