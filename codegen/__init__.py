"""tensorsmith.codegen"""
